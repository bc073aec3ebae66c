"""Runs and the runner-agent protocol (lease semantics: api/runs.py). Users queue and cancel runs;
agent tokens, bound to one cluster, register, lease, heartbeat, upload the profile and finish, for
their cluster only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import selectinload

from api import runs as lifecycle
from api.deps import DB, Agent, Authenticated, IdempotencyKey, MetricsDep, Reports, User
from api.errors import ERROR_RESPONSES, conflict, forbidden, not_found
from api.idempotency import stored_under_key
from api.models import AgentRow, PlanRow, ProfileRow, RunRow, utcnow
from api.planning import request_sha256
from api.profile_checks import check_profile
from api.run_checks import check_run
from api.schemas import (
    MAX_ID,
    AgentCreate,
    AgentOut,
    FinishRequest,
    HeartbeatOut,
    HeartbeatRequest,
    LeaseOut,
    LeaseRequest,
    Page,
    ProfileOut,
    ProfileUpload,
    RunCreate,
    RunOut,
    RunStatus,
)
from api.views import profile_out, run_out
from planner.plan import Plan

router = APIRouter(
    prefix="/v1", tags=["runs"], responses=ERROR_RESPONSES,  # type: ignore[arg-type]
)
Id = Annotated[int, Path(ge=1, le=MAX_ID)]


def _agent_out(a: AgentRow) -> AgentOut:
    return AgentOut(
        id=a.id, name=a.name, cluster=a.cluster, hostname=a.hostname, registered_at=a.registered_at,
        last_seen_at=a.last_seen_at,
    )


def _earlier_run(session: Any, principal: Any, key: str | None, digest: str) -> RunOut | None:
    """The run this token queued under `key` (`api.idempotency`)."""
    row = stored_under_key(session, RunRow, principal.token_id, key, digest, "run")
    return run_out(row) if row is not None else None


@router.post(
    "/plans/{plan_id}/runs", status_code=201, response_model=RunOut, summary="Queue a plan on a cluster",
    responses={200: {"model": RunOut, "description": "the run queued earlier under this Idempotency-Key"}},
)
def create_run(
    plan_id: Id, body: RunCreate, principal: User, db: DB, response: Response,
    idempotency_key: IdempotencyKey = None,
) -> RunOut:
    """Queue the plan's best layout on `cluster` (`api.run_checks`: the process count is the plan's;
    a preset or registered cluster must have the plan's GPU type and hold its GPUs on one node;
    what cannot be checked is said in the run's `notes`)."""
    digest = request_sha256({"plan_id": plan_id, **body.model_dump(mode="json")})
    try:
        with db.write_session() as session:
            earlier = _earlier_run(session, principal, idempotency_key, digest)
            if earlier is not None:
                response.status_code = 200
                return earlier
            plan = session.get(PlanRow, plan_id)
            if plan is None:
                raise not_found("plan", plan_id, ["path", "plan_id"])
            if not plan.feasible:
                raise conflict(f"plan {plan_id} has no layout that fits: nothing to run", ["path", "plan_id"])
            notes = check_run(session, plan_id, plan.plan, body)
            now = utcnow()
            run = RunRow(
                plan_id=plan_id, cluster=body.cluster, status="queued", steps=body.steps,
                max_attempts=body.max_attempts, lease_seconds=body.lease_seconds,
                launch=body.launch.model_dump(mode="json"), attempt=0, cancel_requested=False,
                created_by=principal.token_id, created_at=now, updated_at=now,
                idempotency_key=idempotency_key, request_sha256=digest, notes=notes,
            )
            session.add(run)
            session.flush()
            return run_out(run)
    except IntegrityError:
        if idempotency_key is None:
            raise
        with db.read_session() as session:  # the same key queued concurrently: answer with that run
            earlier = _earlier_run(session, principal, idempotency_key, digest)
        if earlier is None:
            raise
        response.status_code = 200
        return earlier


@router.get("/runs", response_model=Page[RunOut], summary="List runs (agent tokens: their cluster's)")
def list_runs(
    principal: Authenticated, db: DB,
    plan_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    cluster: Annotated[str | None, Query(max_length=64)] = None,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[RunOut]:
    if principal.is_agent:
        if cluster is not None and cluster != principal.cluster:
            raise forbidden(f"an agent token of cluster {principal.cluster!r} cannot read cluster {cluster!r}")
        cluster = principal.cluster
    conds: list[Any] = []
    if plan_id is not None:
        conds.append(RunRow.plan_id == plan_id)
    if cluster is not None:
        conds.append(RunRow.cluster == cluster)
    if status is not None:
        conds.append(RunRow.status == status)
    with db.read_session() as session:
        total = session.scalar(select(func.count()).select_from(RunRow).where(*conds)) or 0
        rows = session.scalars(
            select(RunRow).where(*conds).options(selectinload(RunRow.attempts)).order_by(RunRow.id.desc())
            .limit(limit).offset(offset)
        ).all()
        items = [run_out(r) for r in rows]
    return Page[RunOut](items=items, total=total, limit=limit, offset=offset)


@router.get("/runs/{run_id}", response_model=RunOut, summary="One run with its attempt history")
def get_run(run_id: Id, principal: Authenticated, db: DB) -> RunOut:
    with db.read_session() as session:
        run = session.scalar(select(RunRow).where(RunRow.id == run_id).options(selectinload(RunRow.attempts)))
        if run is None:
            raise not_found("run", run_id, ["path", "run_id"])
        if principal.is_agent and run.cluster != principal.cluster:
            raise forbidden(f"run {run_id} belongs to cluster {run.cluster!r}, not the token's {principal.cluster!r}")
        return run_out(run)


@router.post("/runs/{run_id}/cancel", response_model=RunOut, summary="Cancel a run")
def cancel_run(run_id: Id, principal: User, db: DB) -> RunOut:
    """A queued run is cancelled at once; a leased or running one gets `cancel_requested`, which its
    agent sees on the next heartbeat (it stops the child process and finishes as cancelled). Only
    the token that queued the run, or an admin token, may cancel it (403 otherwise)."""
    with db.write_session() as session:
        return run_out(lifecycle.cancel(session, run_id, principal))


@router.post("/agents", status_code=201, response_model=AgentOut, summary="Register a runner agent")
def register_agent(body: AgentCreate, principal: Agent, db: DB) -> AgentOut:
    if body.cluster != principal.cluster:
        raise forbidden(f"this agent token serves cluster {principal.cluster!r}, not {body.cluster!r}")
    with db.write_session() as session:
        agent = AgentRow(name=body.name, cluster=body.cluster, hostname=body.hostname, token_id=principal.token_id)
        session.add(agent)
        session.flush()
        return _agent_out(agent)


@router.post(
    "/runs/lease", response_model=LeaseOut, summary="Lease the next queued run of the token's cluster",
    responses={204: {"description": "the queue is empty"}},
)
def lease_run(body: LeaseRequest, principal: Agent, db: DB, metrics: MetricsDep) -> Any:
    """Expired leases of the cluster go back to the queue first (or fail after `max_attempts`)."""
    with db.write_session() as session:
        agent = lifecycle.agent_of(session, principal, body.agent_id, ["body", "agent_id"])
        run = lifecycle.lease_next(session, agent)
        if run is None:
            return Response(status_code=204)
        plan = session.get(PlanRow, run.plan_id)
        assert plan is not None  # runs reference plans by foreign key
        out = LeaseOut(
            run=run_out(run), plan=Plan.model_validate(plan.plan), attempt=run.attempt,
            lease_deadline=run.lease_deadline,  # type: ignore[arg-type]
        )
    metrics.leases.inc()
    return out


@router.post("/runs/{run_id}/heartbeat", response_model=HeartbeatOut, summary="Extend a lease, report progress")
def heartbeat(run_id: Id, body: HeartbeatRequest, principal: Agent, db: DB) -> HeartbeatOut:
    """409 when this agent and attempt no longer hold the lease (it expired and was handed on, the
    run finished, ...): the agent must stop the run."""
    with db.write_session() as session:
        run = lifecycle.run_for_agent(session, principal, run_id)
        agent = lifecycle.agent_of(session, principal, body.agent_id, ["body", "agent_id"])
        progress = body.progress.model_dump(mode="json") if body.progress else None
        run = lifecycle.heartbeat(session, run, agent, body.attempt, progress)
        return HeartbeatOut(
            lease_deadline=run.lease_deadline,  # type: ignore[arg-type]
            cancel_requested=run.cancel_requested, status=run.status,  # type: ignore[arg-type]
        )


@router.put(
    "/runs/{run_id}/profile", status_code=201, response_model=ProfileOut, summary="Upload the run's Profile",
    responses={200: {"model": ProfileOut, "description": "the run already has a profile: the stored one"}},
)
def upload_profile(
    run_id: Id, body: ProfileUpload, principal: Agent, db: DB, metrics: MetricsDep, reports: Reports,
    response: Response,
    agent_id: Annotated[int, Query(ge=1, description="the agent holding the lease of this attempt")],
    attempt: Annotated[int, Query(ge=1, description="the leased attempt the profile measures")],
    idempotency_key: Annotated[str | None, Header(max_length=128)] = None,
) -> ProfileOut:
    """Exactly one profile per run, uploaded by the lease holder of the run's current attempt; that
    agent retrying the upload (whatever its key), or a later attempt's holder, gets the stored one
    back (200); another agent gets a 409. A value the plan's hardware cannot produce (a step faster
    than its peak allows, a rank above its GPU's memory, ...) is refused (422, `api.profile_checks`)."""

    def stored_for(session: Any, run: RunRow, agent: AgentRow) -> ProfileOut | None:
        row = session.scalar(select(ProfileRow).where(ProfileRow.run_id == run.id))
        if row is None:
            return None
        lifecycle.check_profile_replay(run, row, agent, attempt)
        return profile_out(row)

    def earlier() -> ProfileOut | None:
        with db.read_session() as session:
            run = lifecycle.run_for_agent(session, principal, run_id, lock=False)
            return stored_for(session, run, lifecycle.agent_of(session, principal, agent_id, ["query", "agent_id"]))

    try:
        with db.write_session() as session:
            run = lifecycle.run_for_agent(session, principal, run_id)
            lifecycle.check_holder_for_profile(run)
            agent = lifecycle.agent_of(session, principal, agent_id, ["query", "agent_id"])
            stored = stored_for(session, run, agent)
            if stored is not None:
                response.status_code = 200
                return stored
            lifecycle.check_lease_holder(run, agent, attempt)
            plan = session.get(PlanRow, run.plan_id)
            assert plan is not None  # runs reference plans by foreign key
            check_profile(plan.plan, body)
            row = ProfileRow(
                run_id=run.id, plan_id=run.plan_id, cluster=run.cluster, attempt=run.attempt, agent_id=agent.id,
                idempotency_key=idempotency_key, step_s=body.step_s, tokens_per_s=body.tokens_per_s, mfu=body.mfu,
                profile=body.model_dump(mode="json"),
            )
            session.add(row)
            session.flush()
            out = profile_out(row)
    except IntegrityError:  # a concurrent upload for the same run won the race
        replayed = earlier()
        if replayed is None:
            raise
        response.status_code = 200
        return replayed
    metrics.profiles.inc()
    reports.request(out.cluster)  # the cluster's error report, in the background (api.calibration)
    return out


@router.post("/runs/{run_id}/finish", response_model=RunOut, summary="Finish a run (status, log tail, exit code)")
def finish_run(run_id: Id, body: FinishRequest, principal: Agent, db: DB) -> RunOut:
    with db.write_session() as session:
        run = lifecycle.run_for_agent(session, principal, run_id)
        agent = lifecycle.agent_of(session, principal, body.agent_id, ["body", "agent_id"])
        run = lifecycle.finish(session, run, agent, body.attempt, body.status, body.log_tail, body.exit_code)
        session.flush()
        return run_out(run)
