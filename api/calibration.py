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

Caching. Profiles and plans never change once stored, so each profile's pair (and the cluster
spec its plan was priced for) is read from the database once (`_PAIRS`, by profile id). The fit a
price needs (`cluster_fit`, no error report: one robust solve over at most `MAX_PROFILES` pairs,
milliseconds) is cached per (database, cluster) and versioned by (number of profiles, newest
profile id, registered spec): a new profile refits on the next request, otherwise the same
`Calibration` object is returned (it keys the cost models' pricing caches by identity). The error
report of `GET /v1/clusters/{name}/calibration` (every plan re-priced, a leave-one-out refit per
profile: seconds with 200 profiles) is computed in the background, in the planner's worker
processes (`CalibrationReports`): a stored profile asks for it, and the page serves the newest
report finished, saying which profiles it covers, and never waits for one."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.errors import ApiError
from api.models import PlanRow, ProfileRow, TeamCluster
from api.resolve import preset_cluster
from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.profile_calibration import CalibrationFit, ProfilePair, fit_cluster_calibration

log = logging.getLogger("autopar.api")

MAX_PROFILES = 200
MAX_CACHED_PAIRS = 20_000
"""Profiles whose pair is kept in memory (a few KB each)."""

_lock = threading.Lock()
_fits: dict[tuple[str, str], tuple[tuple[int, int, str], CalibrationFit]] = {}
_PAIRS: OrderedDict[tuple[str, int], tuple[ProfilePair | None, dict[str, Any] | None]] = OrderedDict()
"""(database, profile id) -> (its pair, or None when unusable; the cluster spec its plan was priced for)."""


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
        select(ProfileRow.id, ProfileRow.run_id)
        .join(PlanRow, PlanRow.id == ProfileRow.plan_id)
        .where(ProfileRow.cluster == cluster_name, PlanRow.cluster_name == cluster_name)
    )


def _db_key(session: Session) -> str:
    return str(session.get_bind().url)  # type: ignore[union-attr]


def _load_pairs(session: Session, ids: list[tuple[int, int]]) -> None:
    """Read the profiles (and their plans) not cached yet, and cache their pairs."""
    db = _db_key(session)
    with _lock:
        missing = [pid for pid, _ in ids if (db, pid) not in _PAIRS]
    if not missing:
        return
    labels = dict(ids)
    rows = session.execute(
        select(ProfileRow.id, ProfileRow.profile, PlanRow.plan)
        .join(PlanRow, PlanRow.id == ProfileRow.plan_id)
        .where(ProfileRow.id.in_(missing))
    ).all()
    fresh: dict[tuple[str, int], tuple[ProfilePair | None, dict[str, Any] | None]] = {}
    for pid, profile, plan in rows:
        try:
            pair: ProfilePair | None = ProfilePair.from_plan_and_profile(plan, profile, label=f"run {labels[pid]}")
        except (ValueError, TypeError, KeyError):
            pair = None
        priced = (plan.get("inputs") or {}).get("cluster") if isinstance(plan, dict) else None
        fresh[(db, pid)] = (pair, priced if isinstance(priced, dict) else None)
    with _lock:
        _PAIRS.update(fresh)
        while len(_PAIRS) > MAX_CACHED_PAIRS:
            _PAIRS.popitem(last=False)


def profile_pairs(session: Session, cluster_name: str, registered: dict[str, Any] | None) -> list[ProfilePair]:
    """(prediction, measurement) pairs of `cluster_name`, oldest first, at most `MAX_PROFILES`;
    unusable rows (no feasible plan, no measured step time) and, when the name is a registered team
    cluster (`registered`: its stored spec), plans priced for another spec are skipped. Never asked
    for a preset: `cluster_fit` answers a preset without reading its profiles (module docstring)."""
    ids = [(int(pid), int(run)) for pid, run in
           session.execute(_scope(cluster_name).order_by(ProfileRow.id.desc()).limit(MAX_PROFILES)).all()]
    ids.reverse()
    _load_pairs(session, ids)
    spec = None
    if registered is not None:
        try:
            spec = ClusterSpec(**registered)
        except ValueError:  # stored before today's bounds and outside them: no plan can be priced for it
            return []
    db = _db_key(session)
    pairs: list[ProfilePair] = []
    for pid, _run in ids:
        with _lock:
            pair, priced = _PAIRS.get((db, pid), (None, None))
        if pair is None:
            continue
        if spec is not None and not _priced_with(priced, spec):
            continue  # a plan priced for another spec under this name (module docstring)
        pairs.append(pair)
    return pairs


def _priced_with(priced: dict[str, Any] | None, spec: ClusterSpec) -> bool:
    """Whether a stored plan was priced for exactly `spec` (its `inputs.cluster`)."""
    try:
        return priced is not None and ClusterSpec(**priced) == spec
    except (TypeError, ValueError):
        return False


def _version(session: Session, cluster_name: str) -> tuple[tuple[int, int, str], dict[str, Any] | None]:
    sub = _scope(cluster_name).subquery()
    n, newest = session.execute(select(func.count(), func.max(sub.c.id)).select_from(sub)).one()
    registered = session.scalar(select(TeamCluster.spec).where(TeamCluster.name == cluster_name))
    # registering the name later changes which profiles count: the spec is part of the version
    return (min(int(n or 0), MAX_PROFILES), int(newest or 0), json.dumps(registered, sort_keys=True)), registered


def cluster_version(session: Session, cluster_name: str) -> tuple[int, int, str]:
    """What a cluster's fit depends on: (profiles counted, newest profile id, registered spec)."""
    return _version(session, cluster_name)[0]


def cluster_fit(session: Session, cluster_name: str) -> CalibrationFit:
    """The fit of `cluster_name` from its stored profiles, without the error report (cached; module
    docstring). For a preset, the global calibration with no profile, whatever is stored."""
    if is_preset(cluster_name):
        return _preset_fit(cluster_name)
    version, registered = _version(session, cluster_name)
    key = (_db_key(session), cluster_name)
    with _lock:
        hit = _fits.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
    fit = fit_cluster_calibration(cluster_name, profile_pairs(session, cluster_name, registered), errors=False)
    with _lock:
        _fits[key] = (version, fit)
    return fit


class CalibrationReports:
    """Error reports of clusters' fits, computed in the background (module docstring).

    `request(cluster)` asks for a report of the cluster's current profiles (a stored profile does);
    one thread reads the pairs and hands the fit to the planner pool, one report at a time, the
    newest request per cluster only. `latest(cluster)` is the newest finished report and the
    version it covers, without waiting."""

    def __init__(self, db: Any, submit: Any):
        self._db = db
        self._submit = submit  # (kind, payload, layouts) -> the pool's job, whose future holds the result
        self._cond = threading.Condition()
        self._wanted: list[str] = []
        self._reports: dict[str, tuple[tuple[int, int, str], CalibrationFit]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="autopar-calibration", daemon=True)
        self._thread.start()

    def request(self, cluster: str) -> None:
        if is_preset(cluster):
            return
        with self._cond:
            if cluster not in self._wanted:
                self._wanted.append(cluster)
                self._cond.notify()

    def latest(self, cluster: str) -> tuple[tuple[int, int, str], CalibrationFit] | None:
        with self._cond:
            return self._reports.get(cluster)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                cluster = self._wanted.pop(0)
            try:
                self._refresh(cluster)
            except Exception:  # keep serving: a failed report is retried by the next request
                log.exception("calibration report for cluster %s failed", cluster)

    def _refresh(self, cluster: str) -> None:
        with self._db.read_session() as session:
            version, registered = _version(session, cluster)
            done = self.latest(cluster)
            if done is not None and done[0] == version:
                return
            pairs = profile_pairs(session, cluster, registered)
        try:
            job = self._submit("calibrate", (cluster, pairs), len(pairs))
            fit: CalibrationFit = job.future.result()
        except ApiError as exc:  # the pool is saturated, or the report overran its time budget
            log.warning("calibration report for cluster %s not computed: %s", cluster, exc.items[0]["msg"])
            return
        with self._cond:
            current = self._reports.get(cluster)
            if current is None or current[0][1] <= version[1]:
                self._reports[cluster] = (version, fit)


def calibration_for(session: Session | None, cluster_name: str) -> Calibration:
    """The calibration to price jobs on `cluster_name` with (the plan records its `source`): the
    global one for a preset or without a database, else the cluster's fit."""
    if session is None or is_preset(cluster_name):
        return default_calibration()
    return cluster_fit(session, cluster_name).calibration
