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


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not a number") from exc
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name}={raw!r}: give a positive, finite number of seconds")
    return value


def cores() -> int:
    """The cores this process may run on (its CPU affinity), the default number of planner workers."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def database_url_from_env() -> str:
    return os.environ.get("AUTOPAR_DATABASE_URL") or DEFAULT_DATABASE_URL


@dataclass(frozen=True)
class Settings:
    """`database_url`: SQLAlchemy URL; `sqlite:///path` (WAL mode, busy timeout) or
    `postgresql+psycopg://user:pass@host/db` (a bare `postgresql://` URL is read as psycopg v3)."""

    database_url: str = field(default_factory=database_url_from_env)
    max_body_bytes: int = field(default_factory=lambda: _int("AUTOPAR_MAX_BODY_BYTES", 1 << 20))
    """Largest accepted request body in bytes (default 1 MiB); larger gives 413."""
    plan_workers: int = field(default_factory=lambda: _int("AUTOPAR_PLAN_WORKERS", cores()))
    """Worker processes that run planner searches and evaluations (default: one per core), besides
    the one that runs only small jobs (`api.planning`)."""
    max_pending_plans: int = field(default_factory=lambda: _int("AUTOPAR_MAX_PENDING_PLANS", 256))
    """Planner jobs queued or running at once; more gives 503 with Retry-After."""
    max_pending_large_plans: int | None = field(
        default_factory=lambda: _int("AUTOPAR_MAX_PENDING_LARGE_PLANS", 0) or None
    )
    """Large searches (over `api.planning.SMALL_LAYOUTS` layouts) queued or running at once (default:
    no fixed cap; a large search is refused when those waiting would take the workers more than one
    time budget to start); more gives 503 with Retry-After."""
    plan_time_budget_s: float = field(default_factory=lambda: _float("AUTOPAR_PLAN_TIME_BUDGET_S", 60.0))
    """Seconds a search or evaluation may run; then it is stopped and nothing is stored (422)."""
    max_plan_layouts: int = field(default_factory=lambda: _int("AUTOPAR_MAX_PLAN_LAYOUTS", 2**24))
    """Most layouts a search may enumerate (`planner.budget.estimate_work`); more is refused (422)."""
    max_plan_bytes: int = field(default_factory=lambda: _int("AUTOPAR_MAX_PLAN_BYTES", 2**31))
    """Most bytes a search may hold by the same estimate; more is refused (422)."""
    sqlite_busy_timeout_ms: int = field(default_factory=lambda: _int("AUTOPAR_SQLITE_BUSY_TIMEOUT_MS", 30_000))
    """Milliseconds a SQLite writer waits for the database lock before failing."""
    reaper_interval_s: int = field(default_factory=lambda: _int("AUTOPAR_REAPER_INTERVAL_S", 5))
    """Seconds between sweeps that requeue or fail runs whose lease deadline passed (0 = only on lease)."""
    max_gpus: int = field(default_factory=lambda: _int("AUTOPAR_MAX_GPUS", 131_072))
    """Largest GPU count a plan or evaluation request may ask for."""
