"""Which calibration prices a plan or an evaluation for a cluster.

`calibration_for` is the single place the API asks. A cluster with stored profiles gets its own
fit (`cost_models.profile_calibration`, method in its docstring) on top of the global calibration
(`cost_models/data/calibration.json`); a cluster without profiles gets the global one unchanged.

Which profiles speak for cluster C: those of runs queued on C (`profiles.cluster`, the name the
agents serve) whose plan was priced for C (`plans.cluster_name`). A team that runs a plan priced
for a shared preset on its own machines therefore recalibrates neither the preset (which others
use) nor its own cluster (whose plans were priced with another spec). At most the newest
`MAX_PROFILES` count.

Fits are cached per (database, cluster, number of profiles, newest profile id): a new profile
refits on the next request, otherwise the same `Calibration` object is returned (it keys the
cost models' pricing caches by identity)."""

from __future__ import annotations

import threading

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.models import PlanRow, ProfileRow
from cost_models.calibration import Calibration, default_calibration
from cost_models.profile_calibration import CalibrationFit, ProfilePair, fit_cluster_calibration

MAX_PROFILES = 200

_lock = threading.Lock()
_cache: dict[tuple[str, str, bool], tuple[tuple[int, int], CalibrationFit]] = {}


def _scope(cluster_name: str):  # type: ignore[no-untyped-def]
    return (
        select(ProfileRow.id, ProfileRow.run_id, ProfileRow.profile, PlanRow.plan)
        .join(PlanRow, PlanRow.id == ProfileRow.plan_id)
        .where(ProfileRow.cluster == cluster_name, PlanRow.cluster_name == cluster_name)
    )


def profile_pairs(session: Session, cluster_name: str) -> list[ProfilePair]:
    """(prediction, measurement) pairs of `cluster_name`, oldest first; unusable rows (no
    feasible plan, no measured step time) are skipped."""
    rows = session.execute(_scope(cluster_name).order_by(ProfileRow.id.desc()).limit(MAX_PROFILES)).all()
    pairs: list[ProfilePair] = []
    for _pid, run_id, profile, plan in reversed(rows):
        try:
            pairs.append(ProfilePair.from_plan_and_profile(plan, profile, label=f"run {run_id}"))
        except (ValueError, TypeError, KeyError):
            continue
    return pairs


def cluster_fit(session: Session, cluster_name: str, *, errors: bool = False) -> CalibrationFit:
    """The fit of `cluster_name` from its stored profiles (`errors`: with the error report)."""
    sub = _scope(cluster_name).subquery()
    n, newest = session.execute(select(func.count(), func.max(sub.c.id)).select_from(sub)).one()
    version = (int(n or 0), int(newest or 0))
    key = (str(session.get_bind().url), cluster_name, errors)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
    fit = fit_cluster_calibration(cluster_name, profile_pairs(session, cluster_name), errors=errors)
    with _lock:
        _cache[key] = (version, fit)
    return fit


def calibration_for(session: Session | None, cluster_name: str) -> Calibration:
    """The calibration to price jobs on `cluster_name` with (the plan records its `source`)."""
    if session is None:
        return default_calibration()
    return cluster_fit(session, cluster_name).calibration
