"""Which calibration prices a plan or an evaluation for a cluster.

`calibration_for` is the single place the API asks. A cluster with stored profiles gets its own
fit (`cost_models.profile_calibration`, method in its docstring) on top of the global calibration
(`cost_models/data/calibration.json`); a cluster without profiles gets the global one unchanged.

A cluster preset (`cluster_specs/data/clusters.yaml`, any name `cluster_specs.presets.get_cluster`
resolves, whatever its case or dashes) is never fitted: it is shared by every team, and the only
thing binding a profile to a cluster name is an agent token for that name, so any team could
otherwise move a preset's prices for all. `cluster_fit` and `calibration_for` answer the global
calibration for a preset whatever profiles runs on that name stored (they stay stored and readable
through `GET /v1/plans/{id}/profiles`); the fit comes only from the project's published runs
(`bench/fit_calibration.py`). To calibrate from profiles, a team registers its own cluster
(`POST /v1/clusters`, a name that is not a preset's) and runs on that name.

Which profiles speak for (non-preset) cluster C: those of runs queued on C (`profiles.cluster`, the
name the agents serve) whose plan was priced for C (`plans.cluster_name`) and, when C is a
registered team cluster, with C's registered spec: an inline cluster spec may carry any name, so a
plan priced for another machine under C's name (the spec stored in the plan differs) does not move
C's fit. A team that runs a plan priced for a shared preset on its own machines therefore
recalibrates neither the preset nor its own cluster (whose plans were priced with another spec).
At most the newest `MAX_PROFILES` count.

Fits are cached per (database, cluster, number of profiles, newest profile id): a new profile
refits on the next request, otherwise the same `Calibration` object is returned (it keys the
cost models' pricing caches by identity)."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.models import PlanRow, ProfileRow, TeamCluster
from api.resolve import preset_cluster
from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.profile_calibration import CalibrationFit, ProfilePair, fit_cluster_calibration

MAX_PROFILES = 200

_lock = threading.Lock()
_cache: dict[tuple[str, str, bool], tuple[tuple[int, int, str], CalibrationFit]] = {}


PRESET_REASON = (
    "cluster preset: calibrated only by the project's fit to published runs (bench/fit_calibration.py), "
    "never by profiles"
)


def is_preset(cluster_name: str) -> bool:
    """Whether `cluster_name` names a cluster preset (as POST /v1/plans would resolve it)."""
    return preset_cluster(cluster_name) is not None


def preset_note(cluster_name: str) -> str:
    """Why a preset's calibration ignores profiles, and how to get a cluster that uses them."""
    return (
        f"{cluster_name!r} is a cluster preset: presets are shared by every team and calibrated only by "
        "the project's fit to published runs (bench/fit_calibration.py), so profiles of runs on this name "
        "are stored (GET /v1/plans/{id}/profiles) but never change its calibration, and plans and "
        "evaluations for it are priced with the global calibration. To calibrate from your profiles, "
        "register a cluster of your own (POST /v1/clusters with a name that is not a preset's and the "
        f"spec {{\"preset\": \"{cluster_name}\"}}, or the fields `autopar clusters --show {cluster_name}` "
        "prints), create the agent token for that name, and plan and queue runs on it."
    )


def stored_profiles(session: Session, cluster_name: str) -> int:
    """How many profiles runs queued on `cluster_name` stored (used by its fit or not)."""
    return int(session.scalar(select(func.count()).select_from(ProfileRow).where(ProfileRow.cluster == cluster_name))
               or 0)


def _preset_fit(cluster_name: str) -> CalibrationFit:
    fit = fit_cluster_calibration(cluster_name, [])
    factors = [dataclasses.replace(f, reason=PRESET_REASON) for f in fit.factors]
    return dataclasses.replace(fit, factors=factors)


def _scope(cluster_name: str):  # type: ignore[no-untyped-def]
    return (
        select(ProfileRow.id, ProfileRow.run_id, ProfileRow.profile, PlanRow.plan)
        .join(PlanRow, PlanRow.id == ProfileRow.plan_id)
        .where(ProfileRow.cluster == cluster_name, PlanRow.cluster_name == cluster_name)
    )


def profile_pairs(session: Session, cluster_name: str, registered: dict[str, Any] | None) -> list[ProfilePair]:
    """(prediction, measurement) pairs of `cluster_name`, oldest first; unusable rows (no
    feasible plan, no measured step time) and, when the name is a registered team cluster
    (`registered`: its stored spec), plans priced for another spec are skipped. Never asked for a
    preset: `cluster_fit` answers a preset without reading its profiles (module docstring)."""
    rows = session.execute(_scope(cluster_name).order_by(ProfileRow.id.desc()).limit(MAX_PROFILES)).all()
    spec = ClusterSpec(**registered) if registered is not None else None
    pairs: list[ProfilePair] = []
    for _pid, run_id, profile, plan in reversed(rows):
        if spec is not None and not _priced_with(plan, spec):
            continue  # a plan priced for another spec under this name (module docstring)
        try:
            pairs.append(ProfilePair.from_plan_and_profile(plan, profile, label=f"run {run_id}"))
        except (ValueError, TypeError, KeyError):
            continue
    return pairs


def _priced_with(plan: dict, spec: ClusterSpec) -> bool:
    """Whether a stored plan was priced for exactly `spec` (its `inputs.cluster`)."""
    try:
        return ClusterSpec(**plan["inputs"]["cluster"]) == spec
    except (KeyError, TypeError, ValueError):
        return False


def cluster_fit(session: Session, cluster_name: str, *, errors: bool = False) -> CalibrationFit:
    """The fit of `cluster_name` from its stored profiles (`errors`: with the error report). For a
    preset, the global calibration with no profile, whatever is stored (module docstring)."""
    if is_preset(cluster_name):
        return _preset_fit(cluster_name)
    sub = _scope(cluster_name).subquery()
    n, newest = session.execute(select(func.count(), func.max(sub.c.id)).select_from(sub)).one()
    registered = session.scalar(select(TeamCluster.spec).where(TeamCluster.name == cluster_name))
    # registering the name later changes which profiles count: the spec is part of the version
    version = (int(n or 0), int(newest or 0), json.dumps(registered, sort_keys=True))
    key = (str(session.get_bind().url), cluster_name, errors)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
    fit = fit_cluster_calibration(cluster_name, profile_pairs(session, cluster_name, registered), errors=errors)
    with _lock:
        _cache[key] = (version, fit)
    return fit


def calibration_for(session: Session | None, cluster_name: str) -> Calibration:
    """The calibration to price jobs on `cluster_name` with (the plan records its `source`): the
    global one for a preset or without a database, else the cluster's fit."""
    if session is None or is_preset(cluster_name):
        return default_calibration()
    return cluster_fit(session, cluster_name).calibration
