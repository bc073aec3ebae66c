"""What a lease answer must hold before the agent acts on it (`Lease.parse`).

The server is trusted to authenticate, not to be well formed: a lease with a missing field, a
string where a number belongs, `true` for a step count, a run id that is not a plain id, a plan
that is not a Plan (`LeasedPlan`), or a plan naming a file outside the attempt's directory
(`files_outside`) is refused, never half-executed. When the answer still names the run and the
attempt (`LeaseIdentity`), the agent finishes that attempt as failed with the reason, so the run
does not wait out its lease; when it does not, the agent can only log it (the lease then expires
on the server and the run is re-queued or fails after `max_attempts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictInt, ValidationError, field_validator

from agent.launcher import MAX_NPROC, MAX_STEPS, SAFE_ID

MAX_LEASE_S = 86_400
"""Longest lease the agent accepts, seconds (the API's bound on `lease_seconds`)."""


def _run_id(value: Any) -> str:
    """A run id usable as a directory name: an integer or a plain token (uuids), as text."""
    if isinstance(value, bool) or not isinstance(value, int | str) or not SAFE_ID.match(str(value)):
        raise ValueError("a run id is an integer or 1-64 of [A-Za-z0-9_-]")
    return str(value)


RunId = Annotated[str, PlainValidator(_run_id)]


class LeaseRefused(ValueError):
    """The lease answer is malformed; `identity` is (run id, attempt) when it still names them."""

    def __init__(self, reason: str, identity: tuple[str, int] | None):
        super().__init__(reason)
        self.identity = identity


class LeasedLaunch(BaseModel):
    model_config = ConfigDict(extra="ignore")

    nproc_per_node: Annotated[StrictInt, Field(ge=1, le=MAX_NPROC)] | None = None
    backend: Literal["auto", "gloo", "nccl"] = "auto"


class LeasedRun(BaseModel):
    """The fields of the run the agent reads (the server sends more: they are ignored)."""

    model_config = ConfigDict(extra="ignore")

    id: RunId
    steps: Annotated[StrictInt, Field(ge=1, le=MAX_STEPS)]
    lease_seconds: Annotated[float, Field(strict=True, gt=0, le=MAX_LEASE_S, allow_inf_nan=False)] = 60.0
    launch: LeasedLaunch = LeasedLaunch()


class LeaseIdentity(BaseModel):
    """Just enough of a lease to report on it: the run's id and the attempt."""

    model_config = ConfigDict(extra="ignore")

    class RunRef(BaseModel):
        model_config = ConfigDict(extra="ignore")
        id: RunId

    run: RunRef
    attempt: Annotated[StrictInt, Field(ge=1)]


class LeasedPlan(BaseModel):
    """What makes the leased `plan` a Plan (`planner.plan.Plan`): its `inputs` and its `best`
    candidate, objects. The runtime reads a JSON with both as a Plan and takes only the plan's
    fields from it (`runtime.spec.run_spec_from_plan`); anything else it would read as a RunSpec,
    whose `data_path` names a file to read and whose values would come back in the profile."""

    model_config = ConfigDict(extra="allow")

    inputs: dict[str, Any]
    best: dict[str, Any]


class Lease(BaseModel):
    """A lease answer (POST /v1/runs/lease, 200): the run, its Plan (kept as data) and the attempt."""

    model_config = ConfigDict(extra="ignore")

    run: LeasedRun
    plan: dict[str, Any]
    attempt: Annotated[StrictInt, Field(ge=1)]

    @field_validator("plan")
    @classmethod
    def _a_plan(cls, plan: dict[str, Any]) -> dict[str, Any]:
        LeasedPlan.model_validate(plan)
        return plan

    @property
    def run_id(self) -> str:
        return self.run.id

    @classmethod
    def parse(cls, answer: Any) -> Lease:
        """The validated lease, or `LeaseRefused` with every problem by its path in the answer."""
        try:
            return cls.model_validate(answer)
        except ValidationError as exc:
            raise LeaseRefused(describe(exc), identity_of(answer)) from None


FILE_FIELDS = ("data_path", "checkpoint_dir")
"""Keys under which a run's JSON names a file or directory the runtime reads (`runtime.spec.RunSpec`
`data_path`; `runtime.launch`'s checkpoint dir): a lease may name one only inside the attempt's
own directory. (The other files of a run, plan.json, profile.json, progress.json, are paths the
agent makes itself.)"""


def files_outside(value: Any, attempt_dir: Path, path: str = "plan") -> list[str]:
    """'plan.x.data_path: /etc/passwd' for every `FILE_FIELDS` value anywhere in `value` that is
    not a path inside `attempt_dir` (relative paths are read from there, as the runtime runs in it;
    `..` and links are resolved first)."""
    out: list[str] = []
    if isinstance(value, dict):
        for key, child in value.items():
            where = f"{path}.{key}"
            if key in FILE_FIELDS and child is not None:
                if not isinstance(child, str) or "\x00" in child:
                    out.append(f"{where}: {str(child)[:200]!r} is not a path")
                elif not (attempt_dir / child).resolve().is_relative_to(attempt_dir.resolve()):
                    out.append(f"{where}: {child[:200]!r} is outside the agent's work dir")
            else:
                out += files_outside(child, attempt_dir, where)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += files_outside(child, attempt_dir, f"{path}.{i}")
    return out


def identity_of(answer: Any) -> tuple[str, int] | None:
    """(run id, attempt) when a malformed answer still names both validly, else None."""
    try:
        ident = LeaseIdentity.model_validate(answer)
    except ValidationError:
        return None
    return ident.run.id, ident.attempt


def describe(exc: ValidationError, limit: int = 10) -> str:
    """'run.steps: Input should be a valid integer; ...', one entry per problem (at most `limit`)."""
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or '(answer)'}: {e['msg'].removeprefix('Value error, ')} "
        f"(got {_short(e.get('input'))})"
        for e in exc.errors(include_url=False)[:limit]
    ]
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
