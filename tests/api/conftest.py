"""A real server for the API tests: `autopar serve` in a subprocess on a free loopback port, on
SQLite and on PostgreSQL (when AUTOPAR_TEST_POSTGRES_URL names a server where we may create
databases; scripts/test.sh starts one). Each backend gets a fresh database for the session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.local_server import LocalServer

REPO = Path(__file__).resolve().parents[2]
PG_ENV = "AUTOPAR_TEST_POSTGRES_URL"
PLAN_BODY: dict[str, Any] = {
    "model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8},
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Server(LocalServer):
    """A running `autopar serve`, its database URL, and helpers to mint tokens in that database."""

    def __init__(self, database_url: str, log_path: Path, env: dict[str, str] | None = None):
        super().__init__(database_url, log_path, env={"AUTOPAR_REAPER_INTERVAL_S": "1", **(env or {})}, cwd=REPO)
        self._db: Any = None

    @property
    def db(self) -> Any:
        if self._db is None:
            from api.db import Database

            self._db = Database(self.database_url)
        return self._db

    def token(self, role: str = "user", cluster: str | None = None, name: str | None = None) -> str:
        from api.auth import create_token

        with self.db.write_session() as session:
            _, secret = create_token(session, name or unique(role), role, cluster)  # type: ignore[arg-type]
        return secret

    def revoke(self, secret: str) -> None:
        from sqlalchemy import select

        from api.auth import hash_token, revoke_token
        from api.models import ApiToken

        with self.db.write_session() as session:
            row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
            assert row is not None
            revoke_token(session, row.id)

    def client(self, token: str | None = None, timeout_s: float = 60.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.stop()
        if self._db is not None:
            self._db.dispose()


def _pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(os.environ[PG_ENV])
    name = f"autopar_test_{uuid.uuid4().hex[:12]}"
    conninfo = dict(
        host=admin.host or "127.0.0.1", port=admin.port or 5432, user=admin.username, password=admin.password,
        dbname=admin.database or "postgres",
    )
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=pytest.mark.skipif(not os.environ.get(PG_ENV), reason=f"{PG_ENV} is not set (scripts/test.sh sets it)"),
    ),
]


@pytest.fixture(scope="session")
def database_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """database_factory(backend) -> a fresh database URL for that backend."""
    cleanups: list[Iterator[str]] = []

    def make(backend: str) -> str:
        if backend == "sqlite":
            return f"sqlite:///{tmp_path_factory.mktemp('db') / 'autopar.db'}"
        gen = _pg_database()
        cleanups.append(gen)
        return next(gen)

    yield make
    for gen in cleanups:
        for _ in gen:  # runs the generator's cleanup
            pass


@pytest.fixture(scope="session", params=BACKENDS)
def server(request: pytest.FixtureRequest, database_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(database_factory(request.param), tmp_path_factory.mktemp("log") / "server.log")
    srv.start()
    yield srv
    srv.close()


@pytest.fixture(scope="session")
def user_token(server: Server) -> str:
    return server.token("user")


@pytest.fixture()
def user(server: Server, user_token: str) -> Iterator[httpx.Client]:
    with server.client(user_token) as c:
        yield c


@pytest.fixture()
def anon(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="session")
def tiny_plan(server: Server, user_token: str) -> dict[str, Any]:
    """One feasible stored plan (tiny model on 4 CPU ranks), shared by the read-only tests."""
    with server.client(user_token) as c:
        r = c.post("/v1/plans", json=PLAN_BODY)
        assert r.status_code == 201, r.text
        return dict(r.json())
