"""The Alembic migrations build exactly the ORM's schema, on every backend, and ship in the package."""

from __future__ import annotations

from importlib import resources
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from api.db import Database, alembic_config
from api.models import Base


def test_migrated_schema_matches_the_models(server: Any) -> None:
    engine = create_engine(server.database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], diff


def test_downgrade_and_upgrade_again(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    db = Database(url)
    db.migrate()
    db.migrate()  # idempotent
    cfg = alembic_config(url)
    command.downgrade(cfg, "base")
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    db.migrate()
    assert {"plans", "runs", "run_attempts", "profiles", "api_tokens"} <= set(inspect(db.engine).get_table_names())
    db.dispose()


def test_migrations_ship_inside_the_package() -> None:
    root = resources.files("api") / "migrations"
    assert (root / "env.py").is_file() and (root / "script.py.mako").is_file()
    assert any(p.name.endswith(".py") and p.name[0].isdigit() for p in (root / "versions").iterdir())
