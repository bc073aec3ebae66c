"""SQLAlchemy 2 ORM tables. Schema changes go through a new Alembic revision in
`api/migrations/versions` (tests compare this metadata with the migrated database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))  # user | agent
    cluster: Mapped[str | None] = mapped_column(String(64))  # agent tokens: the one cluster they serve
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    prefix: Mapped[str] = mapped_column(String(16))  # first characters, to recognise a token in lists
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class PlanRow(Base):
    __tablename__ = "plans"
    __table_args__ = (
        Index("ix_plans_created_at", "created_at"),
        Index("ix_plans_model_cluster", "model_name", "cluster_name"),
        Index("ix_plans_tokens_per_s", "tokens_per_s"),
        # an Idempotency-Key is its token's own: another token's replay never finds this plan
        UniqueConstraint("created_by", "idempotency_key", name="uq_plans_created_by_idempotency_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    model_name: Mapped[str] = mapped_column(String(256))
    cluster_name: Mapped[str] = mapped_column(String(256))
    gpus: Mapped[int] = mapped_column(BigInteger)
    seq_len: Mapped[int] = mapped_column(BigInteger)
    global_batch: Mapped[int] = mapped_column(BigInteger)
    precision: Mapped[str] = mapped_column(String(16))
    # the training method (full | lora | qlora): a column, so the list shows it without the plan JSON
    method: Mapped[str | None] = mapped_column(String(16))
    feasible: Mapped[bool] = mapped_column(Boolean)
    step_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    calibration: Mapped[str] = mapped_column(String(256), default="")
    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    request_sha256: Mapped[str | None] = mapped_column(String(64))
    # ~125 KB of JSON per row: loaded only when a route reads it (lists select the summary columns)
    plan: Mapped[dict[str, Any]] = mapped_column(JSONType, deferred=True)


class TeamModel(Base):
    __tablename__ = "team_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType)  # ModelSpec fields


class TeamCluster(Base):
    __tablename__ = "team_clusters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType)  # ClusterSpec fields (SI units)


class EvaluationRow(Base):
    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    model_name: Mapped[str] = mapped_column(String(256))
    cluster_name: Mapped[str] = mapped_column(String(256))
    gpus: Mapped[int] = mapped_column(Integer)
    job: Mapped[dict[str, Any]] = mapped_column(JSONType)
    result: Mapped[dict[str, Any]] = mapped_column(JSONType)


class AgentRow(Base):
    __tablename__ = "agents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    cluster: Mapped[str] = mapped_column(String(64), index=True)
    hostname: Mapped[str] = mapped_column(String(256))
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"))
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_cluster_status", "cluster", "status", "id"),
        UniqueConstraint("created_by", "idempotency_key", name="uq_runs_created_by_idempotency_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id"), index=True)
    cluster: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # queued|leased|running|succeeded|failed|cancelled
    steps: Mapped[int] = mapped_column(Integer)
    max_attempts: Mapped[int] = mapped_column(Integer)
    lease_seconds: Mapped[int] = mapped_column(Integer)
    launch: Mapped[dict[str, Any]] = mapped_column(JSONType)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # leases handed out so far
    agent_id: Mapped[int | None] = mapped_column(ForeignKey("agents.id"))  # holder of the current lease
    lease_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(BigInteger)
    log_tail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idempotency_key: Mapped[str | None] = mapped_column(String(128))  # per token (migration 0003)
    request_sha256: Mapped[str | None] = mapped_column(String(64))
    notes: Mapped[list[str] | None] = mapped_column(JSONType)  # what queueing could not check (migration 0004)

    attempts: Mapped[list[RunAttempt]] = relationship(
        back_populates="run", order_by="RunAttempt.attempt", cascade="all, delete-orphan"
    )


class RunAttempt(Base):
    __tablename__ = "run_attempts"
    __table_args__ = (UniqueConstraint("run_id", "attempt", name="uq_run_attempts_run_attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    agent_id: Mapped[int] = mapped_column(ForeignKey("agents.id"))
    leased_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str] = mapped_column(String(16))  # running|lease_expired|succeeded|failed|cancelled

    run: Mapped[RunRow] = relationship(back_populates="attempts")


class ProfileRow(Base):
    __tablename__ = "profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), unique=True)  # exactly one profile per run
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id"), index=True)
    cluster: Mapped[str] = mapped_column(String(64), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    agent_id: Mapped[int | None] = mapped_column(  # who uploaded it: the lease holder of `attempt`
        ForeignKey("agents.id", name="fk_profiles_agent_id_agents")
    )
    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    step_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    profile: Mapped[dict[str, Any]] = mapped_column(JSONType)


class ClusterAtlas(Base):
    """A team cluster's measured kernel profile (`autopar profile`, an `autopar-kernel-atlas/1`
    document): at most one per cluster, replaced by the next upload; plans for that cluster are
    priced with it layered over the shipped atlas (migration 0006)."""

    __tablename__ = "cluster_atlases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64), unique=True)
    gpu: Mapped[str] = mapped_column(String(64))  # catalog name of the GPU measured
    device: Mapped[str] = mapped_column(String(256))  # the device as torch named it
    measured_at: Mapped[str] = mapped_column(String(64))  # the profile's own time (ISO 8601)
    digest: Mapped[str] = mapped_column(String(16))  # cost_models.kernels.overlay.digest
    points: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    atlas: Mapped[dict[str, Any]] = mapped_column(JSONType, deferred=True)
