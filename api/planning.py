"""Planner searches and evaluations, run off the event loop.

Searches are CPU-bound Python: they run on a bounded thread pool (`plan_workers` threads) so the
event loop keeps serving reads; at most `max_pending_plans` are queued or running at once, beyond
that POST /v1/plans answers 503 with Retry-After instead of queueing without bound."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import ValidationError

from api.errors import ApiError
from api.metrics import Metrics
from cluster_specs.spec import ClusterSpec
from cost_models.auto_knobs import AutoError
from cost_models.calibration import Calibration
from cost_models.jobs import Job, JobError, price_job
from cost_models.layout import LayoutError
from cost_models.stages import StagePartition
from model_specs.spec import ModelSpec, TrainingSpec
from planner.partitioner import cp_sat_partitioner
from planner.plan import Plan, SearchConstraints
from planner.search import search

log = logging.getLogger("autopar.api")
T = TypeVar("T")


class PlannerPool:
    def __init__(self, workers: int, max_pending: int, metrics: Metrics):
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="autopar-plan")
        self._max_pending = max(1, max_pending)
        self._pending = 0
        self._lock = threading.Lock()
        self._metrics = metrics

    async def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._pending >= self._max_pending:
                self._metrics.planner_rejected.inc()
                raise ApiError(
                    503, f"{self._pending} searches already queued or running; retry later", [], "planner_busy",
                    {"Retry-After": "5"},
                )
            self._pending += 1
            self._metrics.planner_pending.set(self._pending)
        try:
            return await asyncio.wrap_future(self._executor.submit(fn))
        finally:
            with self._lock:
                self._pending -= 1
                self._metrics.planner_pending.set(self._pending)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def request_sha256(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def run_search(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, constraints: SearchConstraints,
    calibration: Calibration, metrics: Metrics,
) -> Plan:
    t0 = time.perf_counter()
    try:
        return search(model, training, cluster, gpus, constraints, calibration=calibration)
    except (ValueError, ArithmeticError, KeyError, IndexError, TypeError) as exc:
        # search() reports impossible jobs in the Plan; an exception here comes from an inline spec
        # the planner cannot price. The input's fault as far as the caller can tell, but logged in
        # full so that a planner bug does not hide behind a 422.
        metrics.planner_errors.inc()
        log.exception("planner search failed for model %s on %s x %d", model.name, cluster.name, gpus)
        raise ApiError(422, f"the planner cannot price this job: {type(exc).__name__}: {exc}", ["body"],
                       "unplannable") from exc
    finally:
        metrics.search_seconds.observe(time.perf_counter() - t0)


def run_evaluation(
    job: Job, model: ModelSpec, cluster: ClusterSpec, calibration: Calibration, metrics: Metrics
) -> dict[str, Any]:
    """Price the job's layout (as `cost_models.jobs.run_job` does, with the cluster's calibration)."""
    try:
        if isinstance(job.partition, list) and not job.auto:
            lay = job.layout.resolved(job.gpus, job.training)
            try:
                StagePartition.explicit(job.partition, lay)
            except ValueError as exc:
                raise ApiError(422, str(exc), ["body", "partition"], "value_error") from exc
        return price_job(job, model, cluster, calibration, partitioner=cp_sat_partitioner)
    except (AutoError, JobError) as exc:
        raise ApiError(422, str(exc), ["body", "layout"], "value_error") from exc
    except LayoutError as exc:
        err = ApiError(422, "invalid layout", ["body", "layout"], "layout")
        err.items = [
            {"loc": ["body", *v.path], "msg": v.message, "type": "layout"}
            for v in exc.violations
        ]
        raise err from exc
    except ValidationError as exc:
        raise ApiError.from_validation(exc, ["body"]) from exc
    except (ValueError, ArithmeticError, KeyError, IndexError, TypeError) as exc:
        metrics.planner_errors.inc()
        log.exception("evaluation failed for model %s on %s x %d", model.name, cluster.name, job.gpus)
        raise ApiError(422, f"cannot price this layout: {type(exc).__name__}: {exc}", ["body"], "unpriceable") from exc
