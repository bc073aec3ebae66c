"""Request and response bodies of the HTTP API. The planner's own models (`Plan`, `TrainingSpec`,
`SearchConstraints`, `ModelSpec`, `ClusterSpec`, `GPUSpec`, the evaluation `Job`) are used as they
are, so the API and the CLI's JSON contract cannot drift apart."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from cluster_specs.spec import MAX_GPUS_PER_NODE, ClusterSpec, GPUSpec
from model_specs.spec import ModelSpec, TrainingSpec
from planner.plan import Plan, SearchConstraints

NAME_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
MAX_GPUS = 131_072
"""Largest GPU count a request may name (2**17)."""

MAX_ID = 2**31 - 1
"""Row ids are 32-bit integers (PostgreSQL `integer`); larger ids are refused as malformed."""
RowId = Annotated[int, Field(ge=1, le=MAX_ID)]

T = TypeVar("T")
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(description="path of the offending field, e.g. ['body', 'training', 'seq_len']")
    msg: str
    type: str


class ErrorResponse(BaseModel):
    detail: list[ErrorItem]


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int = Field(description="matching rows, ignoring limit and offset")
    limit: int
    offset: int


# ---- plans -------------------------------------------------------------------------------------
class PlanRequest(BaseModel):
    """Search every layout of `model` on `gpus` GPUs of `cluster`."""

    model_config = ConfigDict(extra="forbid")

    model: str | dict[str, Any] = Field(
        description="preset or team model name, {'hf_config': {...config.json...}, 'name': ...}, or ModelSpec fields",
        examples=["llama3-8b"],
    )
    cluster: str | dict[str, Any] = Field(
        description="preset or team cluster name, or ClusterSpec fields (vendor units allowed; gpu may be a catalog name)",
        examples=["dgx-h100"],
    )
    gpus: int = Field(gt=0, le=MAX_GPUS, description="GPUs in the job", examples=[8])
    training: TrainingSpec
    constraints: SearchConstraints = SearchConstraints()


class PlanSummary(BaseModel):
    id: int
    created_at: datetime
    model: str
    cluster: str
    gpus: int
    seq_len: int
    global_batch: int = Field(description="sequences per step")
    precision: str
    method: str = Field("full", description="training method: full | lora | qlora")
    feasible: bool
    step_s: float | None = Field(description="predicted seconds per optimizer step (best layout)")
    tokens_per_s: float | None = Field(description="predicted tokens per second (best layout)")
    mfu: float | None = Field(description="predicted model FLOPs utilization, 0-1")
    calibration: str


class PlanRecord(PlanSummary):
    plan: Plan


class ExportOut(BaseModel):
    plan_id: int
    format: str
    filename: str
    text: str
    lost: list[str] = Field(description="what the target cannot express, one sentence each")


# ---- evaluate ----------------------------------------------------------------------------------
class EvaluationOut(BaseModel):
    id: int | None = Field(description="stored evaluation id (only with ?store=true)")
    result: dict[str, Any] = Field(description="cost_models.report.estimate_dict: memory, time, tokens/s, MFU")


# ---- presets and team specs ---------------------------------------------------------------------
STALE_SPEC = (
    "a team spec stored before the service bounded its sizes and outside the bounds now: it can no longer be "
    "used (spec and counts are null); store it again under a new name with the field in bounds"
)


class ModelOut(BaseModel):
    name: str
    source: Literal["preset", "team"]
    params_total: int | None = Field(description="null for a stale team spec (`stale`)")
    params_active: int | None
    spec: ModelSpec | None
    stale: str | None = Field(None, description=f"why the stored spec is unusable: {STALE_SPEC}")


class ClusterOut(BaseModel):
    name: str
    source: Literal["preset", "team"]
    gpu: str | None = Field(description="null for a stale team spec (`stale`)")
    gpus_per_node: int | None
    spec: ClusterSpec | None
    stale: str | None = Field(None, description=f"why the stored spec is unusable: {STALE_SPEC}")


class ModelCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="the name plans and evaluations use afterwards")
    spec: dict[str, Any] = Field(description="ModelSpec fields, or {'hf_config': {...config.json...}}")


class ClusterCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    spec: dict[str, Any] = Field(
        description="ClusterSpec fields; vendor units allowed (e.g. '400 Gb/s'); gpu may be a catalog name"
    )


GPUOut = GPUSpec


# ---- runs (runner protocol) ---------------------------------------------------------------------
RunStatus = Literal["queued", "leased", "running", "succeeded", "failed", "cancelled"]


class Launch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nproc_per_node: int | None = Field(
        None, ge=1, le=MAX_GPUS_PER_NODE,
        description="processes torchrun starts on the agent's node: the plan's GPUs (the default; another count is refused)",
    )
    backend: Literal["auto", "gloo", "nccl"] = "auto"


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster: str = Field(pattern=NAME_PATTERN, description="the cluster name agents register under")
    steps: int = Field(10, ge=1, le=1_000_000, description="training steps")
    max_attempts: int = Field(3, ge=1, le=100, description="leases handed out before the run fails")
    lease_seconds: int = Field(60, ge=1, le=86_400, description="seconds a lease lasts without a heartbeat")
    launch: Launch = Launch()


class RunAttemptOut(BaseModel):
    attempt: int
    agent_id: RowId
    leased_at: datetime
    ended_at: datetime | None
    outcome: Literal["running", "lease_expired", "succeeded", "failed", "cancelled"]


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    steps: int = Field(ge=0)
    loss: Finite | None = None
    message: str | None = Field(None, max_length=4096)


class RunOut(BaseModel):
    id: int
    plan_id: int
    cluster: str
    status: RunStatus
    steps: int
    max_attempts: int
    lease_seconds: int
    launch: Launch
    attempt: int = Field(description="leases handed out so far")
    agent_id: int | None = Field(description="agent holding the current lease")
    lease_deadline: datetime | None
    cancel_requested: bool
    progress: Progress | None
    failure_reason: str | None
    exit_code: int | None
    log_tail: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    attempts: list[RunAttemptOut]
    notes: list[str] = Field(
        default_factory=list,
        description="what queueing could not check (an unregistered cluster's GPUs, a spec other than the plan's)",
    )


class AgentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    cluster: str = Field(pattern=NAME_PATTERN)
    hostname: str = Field(min_length=1, max_length=256)


class AgentOut(BaseModel):
    id: int
    name: str
    cluster: str
    hostname: str
    registered_at: datetime
    last_seen_at: datetime


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: RowId


class LeaseOut(BaseModel):
    run: RunOut
    plan: Plan
    attempt: int
    lease_deadline: datetime


class HeartbeatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: RowId
    attempt: int = Field(ge=1, le=MAX_ID)
    progress: Progress | None = None


class HeartbeatOut(BaseModel):
    lease_deadline: datetime
    cancel_requested: bool
    status: RunStatus


class FinishRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: RowId
    attempt: int = Field(ge=1, le=MAX_ID)
    status: Literal["succeeded", "failed", "cancelled"]
    log_tail: str = Field("", max_length=65_536, description="last lines of the run's log (<= 64 KiB)")
    exit_code: int | None = Field(None, ge=-(2**31), le=2**31 - 1)


class Preflight(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bus_bandwidth_bytes_per_s: NonNegative
    collective: str = Field("all_reduce", max_length=64)
    bytes: int = Field(ge=0)
    ranks: int = Field(ge=1)


class ProfileUpload(BaseModel):
    """The Profile JSON `runtime.launch` writes (runtime/train.py `make_profile`) and the agent's
    optional `preflight`. A closed schema: a field not named here is refused (422), so nothing a
    client invents is stored and served back."""

    model_config = ConfigDict(extra="forbid")

    plan_id: int | None = None
    layout: dict[str, Any] | None = None
    partition: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=65_536)
    start_step: Annotated[int, Field(ge=0)] | None = None
    warmup_steps: Annotated[int, Field(ge=0)] | None = None
    step_times_s: list[NonNegative] = Field(default_factory=list, max_length=1_000_000)
    step_s: NonNegative | None = None
    peak_memory_bytes_per_rank: list[Annotated[int, Field(ge=0)] | None] = Field(default_factory=list, max_length=1_048_576)
    memory_source: str | None = Field(None, max_length=256)
    # start-up and host memory (runtime.host): optional, absent from profiles of older runtimes
    startup_s_per_rank: list[NonNegative | None] = Field(default_factory=list, max_length=1_048_576)
    startup_phases_s: dict[
        Annotated[str, Field(max_length=32)], list[NonNegative | None]
    ] = Field(default_factory=dict, max_length=16)
    host_peak_rss_bytes_per_rank: list[Annotated[int, Field(ge=0)] | None] = Field(
        default_factory=list, max_length=1_048_576
    )
    host_memory_predicted_bytes: Annotated[int, Field(ge=0)] | None = None
    tokens_per_step: NonNegative | None = None
    tokens_per_s: NonNegative | None = None
    model_flops_per_step: NonNegative | None = None
    peak_flops_per_s: NonNegative | None = None
    mfu: NonNegative | None = None
    mfu_convention: str | None = Field(None, max_length=512)
    losses: list[float | None] = Field(default_factory=list, max_length=1_000_000)
    environment: dict[str, Any] = Field(default_factory=dict)
    preflight: Preflight | None = None


class ProfileOut(BaseModel):
    id: int
    run_id: int
    plan_id: int
    cluster: str
    attempt: int
    agent_id: int | None = Field(description="the agent that uploaded it: the lease holder of `attempt`")
    created_at: datetime
    profile: dict[str, Any]


class Predicted(BaseModel):
    step_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    peak_bytes_per_stage: list[int]
    host_peak_bytes: int | None = Field(
        None, description="host memory of the worst rank the runtime's cost model predicted (absent from older profiles)"
    )


class Measured(BaseModel):
    step_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    peak_memory_bytes_per_rank: list[int | None]
    peak_memory_bytes_max: int | None
    startup_s_per_rank: list[float | None] = Field(
        default_factory=list, description="seconds from each rank's start to its first step (absent from older profiles)"
    )
    host_peak_rss_bytes_per_rank: list[int | None] = Field(
        default_factory=list, description="each rank's peak resident host memory (absent from older profiles)"
    )


class PredictionError(BaseModel):
    """(measured - predicted) / predicted; positive step_s_rel = slower than predicted."""

    step_s_rel: float | None
    tokens_per_s_rel: float | None
    mfu_rel: float | None
    peak_memory_rel: float | None = Field(description="max measured rank peak against the worst predicted stage")


class PlanProfileOut(BaseModel):
    profile: ProfileOut
    predicted: Predicted
    measured: Measured
    error: PredictionError


class Health(BaseModel):
    status: Literal["ok"]
    database: str
    migration: str | None
