"""Plans, exports, what-if evaluations, and the profiles measured for a plan."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from api.atlas import stored_atlas
from api.calibration import calibration_for
from api.deps import DB, IdempotencyKey, MetricsDep, Pool, SettingsDep, User
from api.errors import ERROR_RESPONSES, ApiError, ErrorResponse, conflict, not_found
from api.idempotency import stored_under_key
from api.models import EvaluationRow, PlanRow, ProfileRow
from api.planning import evaluation_payload, request_sha256, search_payload
from api.resolve import resolve_cluster_ref, resolve_model_ref
from api.schemas import (
    MAX_ID,
    EvaluationOut,
    ExportOut,
    Page,
    PlanProfileOut,
    PlanRecord,
    PlanRequest,
    PlanSummary,
)
from api.views import SUMMARY_COLUMNS, plan_profile, plan_record, plan_summary, stored_plan, summary_of
from cost_models.jobs import Job
from planner.budget import Budget, estimate_work
from planner.exporters import EXPORTERS, ExportError, export
from planner.inputs import InputProblem, evaluation_problems, plan_problems
from planner.plan import Plan

router = APIRouter(
    prefix="/v1", tags=["plans"], responses=ERROR_RESPONSES,  # type: ignore[arg-type]
)

ExportFormat = Enum("ExportFormat", {f: f for f in EXPORTERS}, type=str)  # type: ignore[misc]
PlanId = Annotated[int, Path(ge=1, le=MAX_ID)]


def refuse_input_problems(problems: list[InputProblem]) -> None:
    """422 with every problem `planner.inputs` finds, each at its field's path in the body."""
    if problems:
        err = ApiError(422, "; ".join(str(p) for p in problems), ["body", *problems[0].loc], "value_error")
        err.items = [{"loc": ["body", *p.loc], "msg": p.message, "type": "value_error"} for p in problems]
        raise err


def _check_gpus(gpus: int, limit: int) -> None:
    if gpus > limit:
        raise ApiError(422, f"{gpus} GPUs: this service plans at most {limit}", ["body", "gpus"], "too_large")


@router.post(
    "/plans", status_code=201, response_model=PlanRecord,
    responses={200: {"model": PlanRecord, "description": "the plan stored earlier under this Idempotency-Key"}},
    summary="Search every layout and store the Plan",
)
async def create_plan(
    body: PlanRequest, principal: User, db: DB, pool: Pool, metrics: MetricsDep, settings: SettingsDep,
    request: Request, response: Response, idempotency_key: IdempotencyKey = None,
) -> PlanRecord:
    """Counts the search's work first (`planner.budget.estimate_work`: layouts to price, bytes to
    hold) and refuses a job over the budget (422, before any search); then runs
    `planner.search.search` in the planner's worker processes, within its time budget (422 and
    nothing stored when it ends first; a client that disconnects cancels its search). A job that
    does not fit is stored too: its Plan has no `best`, and `why`, `rejections` and `closest_miss`
    say which constraint failed and by how many bytes."""
    _check_gpus(body.gpus, settings.max_gpus)
    digest = request_sha256(body.model_dump(mode="json"))

    def replay(session: Any) -> PlanRecord | None:
        """The plan this token stored under the key (`api.idempotency`)."""
        row = stored_under_key(session, PlanRow, principal.token_id, idempotency_key, digest, "plan")
        return plan_record(row) if row is not None else None

    def prepare() -> tuple[PlanRecord | None, Any]:
        with db.read_session() as session:
            earlier = replay(session)
            if earlier is not None:
                return earlier, None
            model = resolve_model_ref(session, body.model, ["body", "model"])
            cluster = resolve_cluster_ref(session, body.cluster, ["body", "cluster"])
            calibration = calibration_for(session, cluster.name)
            # a team cluster named by the request is priced with its measured kernel profile, if stored
            atlas = stored_atlas(session, body.cluster) if isinstance(body.cluster, str) else None
        refuse_input_problems(plan_problems(model, body.training, cluster, body.gpus, body.constraints))
        work = estimate_work(model, body.training, cluster, body.gpus, body.constraints)
        return None, (model, cluster, calibration, atlas, work)

    earlier, resolved = await run_in_threadpool(prepare)
    if earlier is not None:
        response.status_code = 200
        return earlier
    model, cluster, calibration, atlas, work = resolved
    refusal = Budget(settings.max_plan_layouts, settings.max_plan_bytes).refusal(work)
    if refusal is not None:
        metrics.planner_refused.inc()
        raise ApiError(422, refusal, ["body"], "over_work_budget")
    plan: Plan = await pool.run(
        "search", search_payload(model, body.training, cluster, body.gpus, body.constraints, calibration, atlas),
        work.layouts, disconnected=request.is_disconnected,
    )

    def store() -> tuple[PlanSummary | PlanRecord, bool]:
        best = plan.best
        row = PlanRow(
            created_by=principal.token_id, model_name=model.name[:256], cluster_name=cluster.name[:256],
            gpus=body.gpus, seq_len=body.training.seq_len, global_batch=body.training.global_batch,
            precision=body.training.precision, method=body.training.method, feasible=best is not None,
            step_s=best.step_s if best else None, tokens_per_s=best.tokens_per_s if best else None,
            mfu=float(best.estimate["mfu"]) if best else None, calibration=plan.calibration[:256],
            idempotency_key=idempotency_key, request_sha256=digest, plan=plan.model_dump(mode="json"),
        )
        try:
            with db.write_session() as session:
                session.add(row)
                session.flush()
                summary = plan_summary(row)
        except IntegrityError:
            if idempotency_key is None:
                raise
            with db.read_session() as session:  # the same key stored concurrently: return that plan
                earlier = replay(session)
            if earlier is None:
                raise
            return earlier, False
        return summary, True

    stored, created = await run_in_threadpool(store)
    if not created:
        response.status_code = 200
        assert isinstance(stored, PlanRecord)
        return stored
    metrics.plans.labels(str(plan.best is not None).lower()).inc()
    return PlanRecord(**stored.model_dump(), plan=plan)


SortKey = Literal["-created_at", "created_at", "-tokens_per_s", "tokens_per_s", "-mfu", "mfu"]


@router.get("/plans", response_model=Page[PlanSummary], summary="List stored plans")
def list_plans(
    db: DB,
    model: Annotated[str | None, Query(max_length=256, description="model name")] = None,
    cluster: Annotated[str | None, Query(max_length=256, description="cluster name")] = None,
    gpus: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    feasible: bool | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    sort: Annotated[SortKey, Query(description="'-' = descending; tokens_per_s = predicted throughput")] = "-created_at",
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[PlanSummary]:
    conds: list[Any] = []
    if model is not None:
        conds.append(PlanRow.model_name == model)
    if cluster is not None:
        conds.append(PlanRow.cluster_name == cluster)
    if gpus is not None:
        conds.append(PlanRow.gpus == gpus)
    if feasible is not None:
        conds.append(PlanRow.feasible.is_(feasible))
    if created_after is not None:
        conds.append(PlanRow.created_at >= created_after)
    if created_before is not None:
        conds.append(PlanRow.created_at < created_before)
    column = {"created_at": PlanRow.created_at, "tokens_per_s": PlanRow.tokens_per_s, "mfu": PlanRow.mfu}[
        sort.lstrip("-")
    ]
    order = column.desc().nulls_last() if sort.startswith("-") else column.asc().nulls_last()
    id_order = PlanRow.id.desc() if sort.startswith("-") else PlanRow.id.asc()
    with db.read_session() as session:
        total = session.scalar(select(func.count()).select_from(PlanRow).where(*conds)) or 0
        rows = session.execute(
            select(*SUMMARY_COLUMNS).where(*conds).order_by(order, id_order).limit(limit).offset(offset)
        ).all()
        items = [summary_of(r) for r in rows]
    return Page[PlanSummary](items=items, total=total, limit=limit, offset=offset)


def _plan_row(session: Any, plan_id: int) -> PlanRow:
    row = session.get(PlanRow, plan_id)
    if row is None:
        raise not_found("plan", plan_id, ["path", "plan_id"])
    return row  # type: ignore[no-any-return]


@router.get("/plans/{plan_id}", response_model=PlanRecord, summary="One stored plan")
def get_plan(plan_id: PlanId, db: DB) -> PlanRecord:
    with db.read_session() as session:
        return plan_record(_plan_row(session, plan_id))


RAW_MEDIA_TYPES = ("text/x-shellscript", "application/yaml", "application/toml", "text/plain", "application/octet-stream")
"""What `Accept` may name to get the exported file itself (besides the format's own media type)."""


def _accept(header: str | None) -> list[tuple[str, float]]:
    """`Accept` as (media range, q) pairs, highest q first (RFC 9110 section 12.5.1); no header = */*."""
    ranges: list[tuple[str, float]] = []
    for part in (header or "*/*").split(","):
        fields = [f.strip() for f in part.split(";")]
        media, q = fields[0].lower(), 1.0
        for param in fields[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media and 0.0 < q <= 1.0:
            ranges.append((media, q))
    return sorted(ranges, key=lambda r: -r[1])


def _wants_file(header: str | None, media_type: str) -> bool | None:
    """True: the exported file; False: the JSON wrapper; None: nothing acceptable. The wrapper is
    application/json and wins ties (and `*/*`); the file is asked for by its own media type,
    text/plain, text/*, application/octet-stream, or one of RAW_MEDIA_TYPES (for DeepSpeed, whose
    file is JSON, application/json ties and so gives the wrapper)."""
    file_types = {media_type, *RAW_MEDIA_TYPES}
    best_wrapper = best_file = 0.0
    for media, q in _accept(header):
        if media in ("*/*", "application/*", "application/json"):
            best_wrapper = max(best_wrapper, q)
        if media in file_types or media == "text/*":
            best_file = max(best_file, q)
    if best_wrapper == best_file == 0.0:
        return None
    return best_file > best_wrapper


@router.get(
    "/plans/{plan_id}/export/{format}", response_model=ExportOut, summary="Export a plan's layout",
    responses={
        200: {
            "description": "the JSON wrapper (Accept: application/json, the default) or the exported file "
            "itself (Accept: the file's media type, text/plain or application/octet-stream), with "
            "Content-Disposition naming the file",
            "content": {media: {"schema": {"type": "string"}} for media in RAW_MEDIA_TYPES},
        },
        406: {"model": ErrorResponse, "description": "Accept names neither JSON nor the file"},
    },
)
def export_plan(
    plan_id: PlanId, format: ExportFormat, db: DB, response: Response,  # type: ignore[valid-type]
    accept: Annotated[str | None, Header(max_length=1024)] = None,
) -> Any:
    """Launch files for torchrun, Megatron-LM, DeepSpeed, torchtitan or Accelerate
    (`planner.exporters.export`); `lost` lists what the target cannot express (the file lists it
    too). `Accept` decides: application/json (default) gives the JSON wrapper, the file's own
    media type (text/x-shellscript, application/json for DeepSpeed's ds_config.json,
    application/toml, application/yaml), text/plain or application/octet-stream give the file."""
    with db.read_session() as session:
        plan = stored_plan(plan_id, _plan_row(session, plan_id).plan)
    if plan.best is None:
        raise conflict(f"plan {plan_id} has no layout that fits: nothing to export ({'; '.join(plan.why[:1])})",
                       ["path", "plan_id"])
    fmt = format.value  # type: ignore[attr-defined]
    try:
        out = export(plan, fmt)
    except ExportError as exc:
        raise ApiError(422, str(exc), ["path", "format"], "export") from exc
    wants_file = _wants_file(accept, out.media_type)
    if wants_file is None:
        raise ApiError(
            406, f"Accept {accept!r} names neither application/json nor the file ({out.media_type}, "
            "text/plain, application/octet-stream)", ["header", "accept"], "not_acceptable",
        )
    if wants_file:
        return Response(
            content=out.text.encode("utf-8", "backslashreplace"),
            media_type=f"{out.media_type}; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{out.filename}"', "Vary": "Accept"},
        )
    response.headers["Vary"] = "Accept"
    return ExportOut(plan_id=plan_id, format=fmt, filename=out.filename, text=out.text, lost=list(out.lost))


@router.get(
    "/plans/{plan_id}/profiles", response_model=Page[PlanProfileOut],
    summary="Profiles measured for a plan, predicted beside measured",
)
def plan_profiles(
    plan_id: PlanId, db: DB,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Page[PlanProfileOut]:
    with db.read_session() as session:
        plan = _plan_row(session, plan_id).plan
        cond = ProfileRow.plan_id == plan_id
        total = session.scalar(select(func.count()).select_from(ProfileRow).where(cond)) or 0
        rows = session.scalars(select(ProfileRow).where(cond).order_by(ProfileRow.id).limit(limit).offset(offset))
        items = [plan_profile(plan, r) for r in rows]
    return Page[PlanProfileOut](items=items, total=total, limit=limit, offset=offset)


@router.post(
    "/evaluate", response_model=EvaluationOut, summary="Price one layout (what-if)",
    responses={201: {"model": EvaluationOut, "description": "priced and stored (?store=true)"}},
)
async def evaluate(
    job: Job, principal: User, db: DB, pool: Pool, settings: SettingsDep, request: Request, response: Response,
    store: Annotated[bool, Query(description="keep the evaluation in the database")] = False,
) -> EvaluationOut:
    """The batch contract's job (`cost_models.jobs.Job`): memory per stage, time breakdown,
    tokens/s and MFU for one layout, priced in the planner's worker processes (within their time
    budget). Not stored unless `store=true`."""
    if job.gpus > settings.max_gpus:
        raise ApiError(422, f"{job.gpus} GPUs: this service prices at most {settings.max_gpus}", ["body", "gpus"],
                       "too_large")

    def prepare() -> tuple[Any, Any, Any, Any]:
        with db.read_session() as session:
            model = resolve_model_ref(session, job.model, ["body", "model"])
            cluster = resolve_cluster_ref(session, job.cluster, ["body", "cluster"])
            atlas = stored_atlas(session, job.cluster) if isinstance(job.cluster, str) else None
            return model, cluster, calibration_for(session, cluster.name), atlas

    model, cluster, calibration, atlas = await run_in_threadpool(prepare)
    refuse_input_problems(evaluation_problems(job.training, cluster, job.gpus))
    result: dict[str, Any] = await pool.run(
        "evaluate", evaluation_payload(job, model, cluster, calibration, atlas), 1,
        disconnected=request.is_disconnected,
    )
    if not store:
        return EvaluationOut(id=None, result=result)

    def keep() -> int:
        with db.write_session() as session:
            row = EvaluationRow(
                created_by=principal.token_id, model_name=model.name[:256], cluster_name=cluster.name[:256],
                gpus=job.gpus, job=job.model_dump(mode="json"), result=result,
            )
            session.add(row)
            session.flush()
            return row.id

    ident = await run_in_threadpool(keep)
    response.status_code = 201
    return EvaluationOut(id=ident, result=result)
