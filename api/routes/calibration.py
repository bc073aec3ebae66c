"""`GET /v1/clusters/{name}/calibration`: the factors fitted for a cluster from its profiles, how
many profiles they rest on, and the prediction error before and after (in-sample, and leave-one-out
from three profiles on). Method: `cost_models.profile_calibration`; which profiles: `api.calibration`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from api.calibration import cluster_fit, cluster_version, is_preset, preset_note, stored_profiles
from api.deps import DB, Reports
from api.errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1", tags=["calibration"], responses=ERROR_RESPONSES)  # type: ignore[arg-type]
ClusterName = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="cluster name runs are queued on")]


class FactorOut(BaseModel):
    name: str
    prior: float = Field(description="global calibration value")
    fitted: float = Field(description="value used for this cluster")
    identified: bool = Field(description="false: the profiles do not identify it; held at the prior")
    reason: str
    unit: str


class ErrorOut(BaseModel):
    n: int
    median_ape_pct: float
    mape_pct: float
    mean_signed_pct: float = Field(description="mean of 100 x (predicted - measured) / measured")
    method: str


class CalibrationOut(BaseModel):
    cluster: str
    source: str = Field(description="what plans priced for this cluster record in Plan.calibration")
    n_profiles: int
    factors: list[FactorOut]
    time_multipliers: dict[str, float] = Field(description="step-time multipliers vs global (compute, intra, inter)")
    error_before: ErrorOut | None
    error_after: ErrorOut | None
    error_leave_one_out: ErrorOut | None
    method: str
    calibration: dict[str, Any] = Field(description="the full cost_models.calibration.Calibration")
    preset: bool = Field(
        description="a cluster preset: priced with the global calibration only, never fitted from profiles"
    )
    profiles_stored: int = Field(
        description="profiles stored for runs queued on this cluster name, used by the fit or not "
        "(for a preset, none is used)"
    )
    note: str | None = Field(description="for a preset: why profiles do not calibrate it, and what does")
    outliers: list[str] = Field(
        default_factory=list, description="profiles (by run) the robust fit set aside as far off the rest"
    )
    errors_n_profiles: int | None = Field(
        description="profiles the error report covers (it is computed in the background after each new profile)"
    )
    errors_current: bool = Field(description="the error report covers every profile the factors were fitted on")


@router.get(
    "/clusters/{name}/calibration",
    response_model=CalibrationOut,
    summary="Calibration fitted for a cluster from its measured profiles",
)
async def get_cluster_calibration(name: ClusterName, db: DB, reports: Reports) -> CalibrationOut:
    """Factors refitted from the profiles of runs on this cluster (the global calibration with
    `n_profiles = 0` when it has none); plans and evaluations for the cluster are priced with them.
    A cluster preset answers the global calibration (`n_profiles = 0`, `preset: true`, a `note`)
    whatever profiles runs on that name stored: presets are calibrated only by the project's fit
    to published runs. The factors are always those of every stored profile; the error report
    (re-priced and leave-one-out errors) is computed in the background after a profile is stored,
    and this answer gives the newest one finished (`errors_n_profiles`, `errors_current`)."""

    def fit() -> dict[str, Any]:
        preset = is_preset(name)
        with db.read_session() as session:
            current = cluster_fit(session, name)
            out = current.as_dict()
            out["profiles_stored"] = stored_profiles(session, name)
            version = None if preset else cluster_version(session, name)
        report = None if preset else reports.latest(name)
        if not preset and (report is None or report[0] != version):
            reports.request(name)  # computed in the background; this answer does not wait for it
        if report is not None:
            done = report[1].as_dict()
            for key in ("error_before", "error_after", "error_leave_one_out"):
                out[key] = done[key]
        out["errors_n_profiles"] = report[1].n_profiles if report is not None else None
        out["errors_current"] = preset or (report is not None and report[0] == version)
        out["preset"] = preset
        out["note"] = preset_note(name) if preset else None
        return out

    return CalibrationOut.model_validate(await run_in_threadpool(fit))
