"""Engine, sessions and migrations.

SQLite: WAL journal, `busy_timeout`, foreign keys on, `synchronous=FULL` (an acknowledged write
survives a crash of the process and of the machine). pysqlite's own transaction handling is turned
off so that we emit BEGIN ourselves: write transactions use `BEGIN IMMEDIATE`, which takes the write
lock up front and waits for it under the busy timeout; a deferred transaction that reads and then
writes could otherwise fail at once with SQLITE_BUSY when another writer got there first.

PostgreSQL: psycopg v3 (`postgresql+psycopg://`; a bare `postgresql://` is read as psycopg), pool
pre-ping. Every request runs in one transaction (`write_session` / `read_session`): it commits once
at the end or rolls back whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def normalize_url(url: str) -> str:
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def is_sqlite(engine_or_url: Engine | str) -> bool:
    url = engine_or_url.url if isinstance(engine_or_url, Engine) else make_url(engine_or_url)
    return url.get_backend_name() == "sqlite"


def make_engine(url: str, *, busy_timeout_ms: int = 30_000) -> Engine:
    url = normalize_url(url)
    if is_sqlite(url):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000}, pool_size=16,
            max_overflow=16,
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see the module docstring)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            mode = "IMMEDIATE" if conn.get_execution_options().get("autopar_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=16, max_overflow=16)


class Database:
    """One engine and its two session factories (read: deferred; write: immediate on SQLite)."""

    def __init__(self, url: str, *, busy_timeout_ms: int = 30_000):
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, busy_timeout_ms=busy_timeout_ms)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(self.engine.execution_options(autopar_write=True), expire_on_commit=False)

    @property
    def sqlite(self) -> bool:
        return is_sqlite(self.engine)

    @contextmanager
    def write_session(self) -> Iterator[Session]:
        """One transaction: commit on success, roll back whole on any exception."""
        with self._write() as session, session.begin():
            yield session

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    def migrate(self) -> None:
        migrate(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(engine: Engine) -> None:
    """Apply every Alembic migration up to head (idempotent; the scripts ship inside the package).

    SQLite: foreign-key enforcement is off while the migrations run, because batch migrations
    rebuild a table (copy, drop, rename) and dropping a table that other rows reference would fail
    or cascade; the keys are checked before the transaction commits (SQLite's own recipe, section 7
    of https://www.sqlite.org/lang_altertable.html)."""
    from alembic import command

    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        if sqlite:
            _sqlite_foreign_keys(conn, enabled=False)
        try:
            with conn.begin():
                if engine.dialect.name == "postgresql":
                    # Two servers starting at once on one database migrate one after the other.
                    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7366746)")
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                if sqlite:
                    _check_sqlite_foreign_keys(conn)
        finally:
            if sqlite:
                _sqlite_foreign_keys(conn, enabled=True)


def _sqlite_foreign_keys(conn: Any, *, enabled: bool) -> None:
    """PRAGMA foreign_keys on the DBAPI connection, outside any transaction (inside one it is a no-op)."""
    conn.connection.dbapi_connection.execute(f"PRAGMA foreign_keys={'ON' if enabled else 'OFF'}")


def _check_sqlite_foreign_keys(conn: Any) -> None:
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        raise RuntimeError(f"migration left {len(broken)} rows with dangling foreign keys, e.g. {tuple(broken[0])}")
