"""Run lifecycle and leases (the service side of the runner protocol, issue 6).

    queued -> leased -> running -> succeeded | failed | cancelled
    leased | running -> queued            (lease deadline passed, attempts left)
    leased | running -> failed            (lease deadline passed, `max_attempts` leases used)

Every function runs inside the caller's write transaction. A run is leased by at most one agent at a
time: on PostgreSQL the candidate row is locked with SELECT ... FOR UPDATE SKIP LOCKED, so concurrent
lessees pick different rows; on SQLite write transactions begin IMMEDIATE (one writer at a time).
On both, the lease itself is a conditional UPDATE ... WHERE status = 'queued' whose row count is
checked, so a row that changed under us is never handed out twice.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, select, update
from sqlalchemy.orm import Session, selectinload

from api.auth import Principal
from api.errors import ApiError, conflict, forbidden, not_found
from api.models import AgentRow, ProfileRow, RunAttempt, RunRow, utcnow

ACTIVE = ("leased", "running")
TERMINAL = ("succeeded", "failed", "cancelled")


def _locking(session: Session, stmt: Select[Any]) -> Select[Any]:
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True)
    return stmt


def _current_attempt(run: RunRow) -> RunAttempt | None:
    for a in run.attempts:
        if a.attempt == run.attempt:
            return a
    return None


def _expire(run: RunRow, now: datetime) -> str:
    """Take back an expired lease; returns the outcome ('requeued' | 'failed' | 'cancelled')."""
    current = _current_attempt(run)
    if current is not None:
        current.outcome = "lease_expired"
        current.ended_at = now
    run.agent_id = None
    run.lease_deadline = None
    run.updated_at = now
    expired = sum(1 for a in run.attempts if a.outcome == "lease_expired")
    if run.cancel_requested:
        run.status = "cancelled"
        run.finished_at = now
        run.failure_reason = "cancelled while its lease expired"
        return "cancelled"
    if run.attempt >= run.max_attempts:
        run.status = "failed"
        run.finished_at = now
        run.failure_reason = f"lease expired {expired} times (max_attempts {run.max_attempts})"
        return "failed"
    run.status = "queued"
    return "requeued"


def expire_leases(session: Session, cluster: str | None = None, now: datetime | None = None) -> list[str]:
    """Requeue or fail the runs (of `cluster`, or all) whose lease deadline has passed.

    On PostgreSQL the expired rows are locked *waiting* (FOR UPDATE, not SKIP LOCKED): when the reaper holds
    one, a lease call waits for its commit and then sees the run queued. Skipping it would make the lease
    answer "nothing queued" (204) for a run that is being requeued that instant. Both callers lock in id
    order, so two expirers cannot deadlock.
    """
    now = now or utcnow()
    stmt = (
        select(RunRow)
        .where(RunRow.status.in_(ACTIVE), RunRow.lease_deadline < now)
        .options(selectinload(RunRow.attempts))
        .order_by(RunRow.id)
    )
    if cluster is not None:
        stmt = stmt.where(RunRow.cluster == cluster)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return [_expire(run, now) for run in session.scalars(stmt)]


def agent_of(session: Session, principal: Principal, agent_id: int, loc: list[str | int]) -> AgentRow:
    """The agent `agent_id`, if the calling token registered it (POST /v1/agents): an agent id is
    the token's own, never a handle another token of the same cluster may act under (403)."""
    agent = session.get(AgentRow, agent_id)
    if agent is None:
        raise not_found("agent", agent_id, loc)
    if agent.cluster != principal.cluster:
        raise forbidden(f"agent {agent_id} serves cluster {agent.cluster!r}, the token cluster {principal.cluster!r}")
    if agent.token_id != principal.token_id:
        raise forbidden(
            f"agent {agent_id} was registered by another token; a token acts only as the agents it registered "
            "(POST /v1/agents)", loc,
        )
    return agent


def run_for_agent(session: Session, principal: Principal, run_id: int, lock: bool = True) -> RunRow:
    stmt = select(RunRow).where(RunRow.id == run_id).options(selectinload(RunRow.attempts))
    if lock and session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    run = session.scalar(stmt)
    if run is None:
        raise not_found("run", run_id, ["path", "run_id"])
    if run.cluster != principal.cluster:
        raise forbidden(f"run {run_id} belongs to cluster {run.cluster!r}, not the token's {principal.cluster!r}")
    return run


def lease_next(session: Session, agent: AgentRow, now: datetime | None = None) -> RunRow | None:
    """Lease the oldest queued run of the agent's cluster, or None when its queue is empty."""
    now = now or utcnow()
    expire_leases(session, agent.cluster, now)
    agent.last_seen_at = now
    for _ in range(8):  # a candidate taken by someone else between SELECT and UPDATE: try the next
        stmt = (
            select(RunRow.id)
            .where(RunRow.cluster == agent.cluster, RunRow.status == "queued", RunRow.cancel_requested.is_(False))
            .order_by(RunRow.id)
            .limit(1)
        )
        run_id = session.scalar(_locking(session, stmt))
        if run_id is None:
            return None
        result = session.execute(
            update(RunRow)
            .where(RunRow.id == run_id, RunRow.status == "queued")
            .values(status="leased", agent_id=agent.id, attempt=RunRow.attempt + 1, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            continue
        run = session.scalars(
            select(RunRow).where(RunRow.id == run_id).options(selectinload(RunRow.attempts)),
            execution_options={"populate_existing": True},
        ).one()
        run.lease_deadline = now + timedelta(seconds=run.lease_seconds)
        run.progress = None
        run.attempts.append(RunAttempt(attempt=run.attempt, agent_id=agent.id, leased_at=now, outcome="running"))
        session.flush()
        return run
    return None


def _holds(run: RunRow, agent_id: int, attempt: int) -> bool:
    return run.status in ACTIVE and run.agent_id == agent_id and run.attempt == attempt


def heartbeat(session: Session, run: RunRow, agent: AgentRow, attempt: int, progress: dict[str, Any] | None) -> RunRow:
    now = utcnow()
    if not _holds(run, agent.id, attempt):
        raise conflict(
            f"agent {agent.id} attempt {attempt} does not hold run {run.id} "
            f"(status {run.status}, attempt {run.attempt}, agent {run.agent_id})",
            ["body", "attempt"],
        )
    if run.status == "leased":
        run.status = "running"
    run.lease_deadline = now + timedelta(seconds=run.lease_seconds)
    if progress is not None:
        run.progress = progress
    run.updated_at = now
    agent.last_seen_at = now
    return run


def final_progress(progress: dict[str, Any] | None, steps: int, status: str) -> dict[str, Any]:
    """The progress a finished run shows: the last heartbeat's loss and step (all steps when it
    succeeded), with the final status as the message, never the heartbeat's stale "training"."""
    last = dict(progress or {})
    total = int(last.get("steps") or steps)
    step = total if status == "succeeded" else min(int(last.get("step") or 0), total)
    return {"step": step, "steps": total, "loss": last.get("loss"), "message": status}


def finish(
    session: Session, run: RunRow, agent: AgentRow, attempt: int, status: str, log_tail: str, exit_code: int | None
) -> RunRow:
    now = utcnow()
    current = _current_attempt(run)
    if run.status in TERMINAL and run.attempt == attempt and current is not None and current.agent_id == agent.id:
        return run  # the same finish, retried
    if not _holds(run, agent.id, attempt):
        raise conflict(
            f"agent {agent.id} attempt {attempt} does not hold run {run.id} "
            f"(status {run.status}, attempt {run.attempt}, agent {run.agent_id})",
            ["body", "attempt"],
        )
    run.status = status
    run.finished_at = now
    run.updated_at = now
    run.lease_deadline = None
    run.log_tail = log_tail
    run.exit_code = exit_code
    run.progress = final_progress(run.progress, run.steps, status)
    if status == "failed":
        run.failure_reason = f"agent {agent.id} reported failure" + (f" (exit code {exit_code})" if exit_code is not None else "")
    elif status == "cancelled":
        run.failure_reason = "cancelled" + (" on request" if run.cancel_requested else " by the agent")
    if current is not None:
        current.outcome = status
        current.ended_at = now
    agent.last_seen_at = now
    return run


def check_may_cancel(run: RunRow, principal: Principal) -> None:
    """403 unless the token queued the run or is an admin token (runs are readable by every user,
    so refusing is no secret: a 404 would hide nothing)."""
    if principal.is_admin or (run.created_by is not None and run.created_by == principal.token_id):
        return
    raise forbidden(
        f"run {run.id} was queued by another token: only the token that queued it or an admin token "
        "(autopar tokens create --role admin) may cancel it", ["path", "run_id"],
    )


def cancel(session: Session, run_id: int, principal: Principal) -> RunRow:
    stmt = select(RunRow).where(RunRow.id == run_id).options(selectinload(RunRow.attempts))
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    run = session.scalar(stmt)
    if run is None:
        raise not_found("run", run_id, ["path", "run_id"])
    check_may_cancel(run, principal)
    if run.status in ("succeeded", "failed"):
        raise conflict(f"run {run_id} already {run.status}", ["path", "run_id"])
    now = utcnow()
    if run.status == "cancelled":
        return run
    run.cancel_requested = True
    run.updated_at = now
    if run.status == "queued":
        run.status = "cancelled"
        run.finished_at = now
        run.failure_reason = f"cancelled by {principal.name} before it was leased"
    return run


def check_lease_holder(run: RunRow, agent: AgentRow, attempt: int) -> None:
    """409 unless `agent` holds the lease of the run's current `attempt` (a profile of an attempt
    held by another agent, of an earlier attempt, or of a finished run is refused)."""
    if not _holds(run, agent.id, attempt):
        raise conflict(
            f"agent {agent.id} attempt {attempt} does not hold run {run.id} "
            f"(status {run.status}, attempt {run.attempt}, agent {run.agent_id}): only the lease holder uploads its profile",
            ["query", "attempt"],
        )


def check_profile_replay(run: RunRow, stored: ProfileRow, agent: AgentRow, attempt: int) -> None:
    """The stored profile goes back (as the answer to a retried upload) to the agent and attempt
    that uploaded it, or to the current lease holder (one profile per run: a re-leased attempt
    finds its predecessor's); anyone else gets a 409, not the impression that theirs was stored."""
    author = stored.agent_id  # migration 0002 filled it in for profiles stored before it existed
    if (author, stored.attempt) != (agent.id, attempt) and not _holds(run, agent.id, attempt):
        raise conflict(
            f"run {run.id} already has its profile, uploaded by agent {author} for attempt {stored.attempt}",
            ["query", "attempt"],
        )


def check_holder_for_profile(run: RunRow) -> None:
    if run.attempt < 1:
        raise ApiError(409, f"run {run.id} was never leased: no profile can exist yet", ["path", "run_id"], "conflict")
