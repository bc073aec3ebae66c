"""Rows to response bodies."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from api.errors import ApiError
from api.models import PlanRow, ProfileRow, RunRow
from api.schemas import (
    Measured,
    PlanProfileOut,
    PlanRecord,
    PlanSummary,
    Predicted,
    PredictionError,
    ProfileOut,
    RunAttemptOut,
    RunOut,
)
from planner.plan import Plan

SUMMARY_COLUMNS = (
    PlanRow.id, PlanRow.created_at, PlanRow.model_name, PlanRow.cluster_name, PlanRow.gpus, PlanRow.seq_len,
    PlanRow.global_batch, PlanRow.precision, PlanRow.method, PlanRow.feasible, PlanRow.step_s, PlanRow.tokens_per_s,
    PlanRow.mfu, PlanRow.calibration,
)
"""The columns of a plan's summary: a list selects these and never the plan JSON."""


def summary_of(r: Any) -> PlanSummary:
    """The summary of a row of `SUMMARY_COLUMNS`."""
    return PlanSummary(
        id=r.id, created_at=r.created_at, model=r.model_name, cluster=r.cluster_name, gpus=r.gpus, seq_len=r.seq_len,
        global_batch=r.global_batch, precision=r.precision, method=r.method or "full", feasible=r.feasible,
        step_s=r.step_s, tokens_per_s=r.tokens_per_s, mfu=r.mfu, calibration=r.calibration,
    )


def plan_summary(row: PlanRow) -> PlanSummary:
    return PlanSummary(
        id=row.id, created_at=row.created_at, model=row.model_name, cluster=row.cluster_name, gpus=row.gpus,
        seq_len=row.seq_len, global_batch=row.global_batch, precision=row.precision,
        method=row.method or "full", feasible=row.feasible,
        step_s=row.step_s, tokens_per_s=row.tokens_per_s, mfu=row.mfu, calibration=row.calibration,
    )


def stored_plan(plan_id: int, data: dict[str, Any]) -> Plan:
    """A stored Plan; one stored before the service bounded its sizes, whose inputs are outside the
    bounds now, is a 409 naming the field (it can be neither served as a Plan nor run)."""
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ApiError(
            409, f"plan {plan_id} was stored before the service bounded its sizes and its {field} is outside them "
            f"now ({first['msg']}): plan the job again with the field in bounds", ["path", "plan_id"], "stale_plan",
        ) from exc


def plan_record(row: PlanRow) -> PlanRecord:
    return PlanRecord(**plan_summary(row).model_dump(), plan=stored_plan(row.id, row.plan))


def run_out(run: RunRow) -> RunOut:
    return RunOut(
        id=run.id, plan_id=run.plan_id, cluster=run.cluster, status=run.status,  # type: ignore[arg-type]
        steps=run.steps, max_attempts=run.max_attempts, lease_seconds=run.lease_seconds,
        launch=run.launch,  # type: ignore[arg-type]
        attempt=run.attempt, agent_id=run.agent_id, lease_deadline=run.lease_deadline,
        cancel_requested=run.cancel_requested, progress=run.progress,  # type: ignore[arg-type]
        failure_reason=run.failure_reason, exit_code=run.exit_code, log_tail=run.log_tail,
        created_at=run.created_at, updated_at=run.updated_at, finished_at=run.finished_at, notes=run.notes or [],
        attempts=[
            RunAttemptOut(
                attempt=a.attempt, agent_id=a.agent_id, leased_at=a.leased_at, ended_at=a.ended_at,
                outcome=a.outcome,  # type: ignore[arg-type]
            )
            for a in run.attempts
        ],
    )


def profile_out(row: ProfileRow) -> ProfileOut:
    return ProfileOut(
        id=row.id, run_id=row.run_id, plan_id=row.plan_id, cluster=row.cluster, attempt=row.attempt,
        agent_id=row.agent_id, created_at=row.created_at, profile=row.profile,
    )


def _rel(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or predicted is None or predicted == 0:
        return None
    return (measured - predicted) / predicted


def plan_profile(plan: dict[str, Any], row: ProfileRow) -> PlanProfileOut:
    """Predicted (the plan's best candidate, as priced when planned) beside measured."""
    est = (plan.get("best") or {}).get("estimate") or {}
    stages = (est.get("memory") or {}).get("stages") or []
    predicted = Predicted(
        step_s=est.get("step_s"), tokens_per_s=est.get("tokens_per_s"), mfu=est.get("mfu"),
        peak_bytes_per_stage=[int(s.get("total_bytes", 0)) for s in stages],
        host_peak_bytes=row.profile.get("host_memory_predicted_bytes"),
    )
    prof = row.profile
    peaks = [p if isinstance(p, int) else None for p in prof.get("peak_memory_bytes_per_rank") or []]
    known = [p for p in peaks if p is not None]
    measured = Measured(
        step_s=prof.get("step_s"), tokens_per_s=prof.get("tokens_per_s"), mfu=prof.get("mfu"),
        peak_memory_bytes_per_rank=peaks, peak_memory_bytes_max=max(known) if known else None,
        startup_s_per_rank=list(prof.get("startup_s_per_rank") or []),
        host_peak_rss_bytes_per_rank=list(prof.get("host_peak_rss_bytes_per_rank") or []),
    )
    worst = max(predicted.peak_bytes_per_stage) if predicted.peak_bytes_per_stage else None
    error = PredictionError(
        step_s_rel=_rel(measured.step_s, predicted.step_s),
        tokens_per_s_rel=_rel(measured.tokens_per_s, predicted.tokens_per_s),
        mfu_rel=_rel(measured.mfu, predicted.mfu),
        peak_memory_rel=_rel(measured.peak_memory_bytes_max, worst),
    )
    return PlanProfileOut(profile=profile_out(row), predicted=predicted, measured=measured, error=error)
