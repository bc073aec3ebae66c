"""Service settings, read from the environment (`AUTOPAR_*`) once at start."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

DEFAULT_DATABASE_URL = "sqlite:///./autopar.db"


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not an integer") from exc


def database_url_from_env() -> str:
    return os.environ.get("AUTOPAR_DATABASE_URL") or DEFAULT_DATABASE_URL


@dataclass(frozen=True)
class Settings:
    """`database_url`: SQLAlchemy URL; `sqlite:///path` (WAL mode, busy timeout) or
    `postgresql+psycopg://user:pass@host/db` (a bare `postgresql://` URL is read as psycopg v3)."""

    database_url: str = field(default_factory=database_url_from_env)
    max_body_bytes: int = field(default_factory=lambda: _int("AUTOPAR_MAX_BODY_BYTES", 1 << 20))
    """Largest accepted request body in bytes (default 1 MiB); larger gives 413."""
    plan_workers: int = field(default_factory=lambda: _int("AUTOPAR_PLAN_WORKERS", 4))
    """Threads that run planner searches (off the event loop)."""
    max_pending_plans: int = field(default_factory=lambda: _int("AUTOPAR_MAX_PENDING_PLANS", 256))
    """Searches queued or running at once; more gives 503 with Retry-After."""
    sqlite_busy_timeout_ms: int = field(default_factory=lambda: _int("AUTOPAR_SQLITE_BUSY_TIMEOUT_MS", 30_000))
    """Milliseconds a SQLite writer waits for the database lock before failing."""
    reaper_interval_s: int = field(default_factory=lambda: _int("AUTOPAR_REAPER_INTERVAL_S", 5))
    """Seconds between sweeps that requeue or fail runs whose lease deadline passed (0 = only on lease)."""
    max_gpus: int = field(default_factory=lambda: _int("AUTOPAR_MAX_GPUS", 131_072))
    """Largest GPU count a plan or evaluation request may ask for."""
