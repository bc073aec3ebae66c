"""The Alembic migrations build exactly the ORM's schema, on every backend, and ship in the package."""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlalchemy.exc import IntegrityError

from api.db import Database, alembic_config
from api.models import Base

from .conftest import BACKENDS


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


def test_upgrade_keeps_rows_scopes_keys_per_token_and_records_profile_authors(tmp_path: Any) -> None:
    """0001 -> head on a database holding plans, runs and a profile: SQLite rebuilds `plans` (its
    rows are referenced), the idempotency key becomes unique per token, existing profiles get the
    agent that held their attempt."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0001")
    engine = create_engine(url)
    t = "'2026-01-01 00:00:00'"
    rows = [
        f"INSERT INTO api_tokens VALUES (1, 'alice', 'user', NULL, 'h1', 'apt_a', {t}, NULL)",
        f"INSERT INTO api_tokens VALUES (2, 'bob', 'user', NULL, 'h2', 'apt_b', {t}, NULL)",
        f"INSERT INTO api_tokens VALUES (3, 'rack', 'agent', 'rack', 'h3', 'apt_c', {t}, NULL)",
        f"INSERT INTO plans (id, created_at, created_by, model_name, cluster_name, gpus, seq_len, global_batch, "
        f"precision, feasible, calibration, idempotency_key, plan) VALUES (1, {t}, 1, 'm', 'c', 1, 1, 1, 'bf16', 1, '', "
        "'k', '{}')",
        f"INSERT INTO agents VALUES (7, 'a', 'rack', 'h', 3, {t}, {t})",
        f"INSERT INTO runs (id, plan_id, cluster, status, steps, max_attempts, lease_seconds, launch, attempt, "
        f"cancel_requested, created_at, updated_at) VALUES (1, 1, 'rack', 'succeeded', 1, 1, 1, '{{}}', 1, 0, {t}, {t})",
        f"INSERT INTO run_attempts (run_id, attempt, agent_id, leased_at, outcome) VALUES (1, 1, 7, {t}, 'succeeded')",
        f"INSERT INTO profiles (run_id, plan_id, cluster, attempt, created_at, profile) VALUES (1, 1, 'rack', 1, {t}, '{{}}')",
    ]
    with engine.begin() as conn:
        for sql in rows:
            conn.exec_driver_sql(sql)
    engine.dispose()
    db = Database(url)
    db.migrate()
    try:
        with db.engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one() == 1
            assert conn.exec_driver_sql("SELECT agent_id FROM profiles").scalar_one() == 7
            insert = ("INSERT INTO plans (created_at, created_by, model_name, cluster_name, gpus, seq_len, global_batch, "
                      f"precision, feasible, calibration, idempotency_key, plan) VALUES ({t}, %s, 'm', 'c', 1, 1, 1, "
                      "'bf16', 1, '', 'k', '{}')")
            conn.exec_driver_sql(insert % 2)  # bob may use alice's key
        with pytest.raises(IntegrityError), db.engine.begin() as conn:
            conn.exec_driver_sql(insert % 1)  # alice may not use hers twice
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == [], diff
    finally:
        db.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_plan_method_column_is_filled_from_each_stored_plan(backend: Any, database_factory: Any) -> None:
    """0004 -> 0005 on plans stored before it: each plan's method comes from its JSON by the database's
    own JSON functions (`inputs.training.method`), and a plan whose JSON names none trained in full."""
    url = database_factory(backend)
    command.upgrade(alembic_config(url), "0004")
    engine = create_engine(url)
    t = "'2026-01-01 00:00:00'"
    plans = {1: '{"inputs": {"training": {"method": "qlora"}}}', 2: '{"inputs": {"training": {}}}', 3: "{}"}
    try:
        with engine.begin() as conn:
            for ident, data in plans.items():
                conn.exec_driver_sql(
                    "INSERT INTO plans (id, created_at, model_name, cluster_name, gpus, seq_len, global_batch, precision, "
                    f"feasible, calibration, plan) VALUES ({ident}, {t}, 'm', 'c', 1, 1, 1, 'bf16', false, '', '{data}')"
                )
        command.upgrade(alembic_config(url), "head")
        with engine.connect() as conn:
            methods = dict(conn.exec_driver_sql("SELECT id, method FROM plans ORDER BY id").all())
    finally:
        engine.dispose()
    assert methods == {1: "qlora", 2: "full", 3: "full"}
