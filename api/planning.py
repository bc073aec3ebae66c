"""Planner searches and evaluations, run in a pool of worker processes.

Why processes: the search is CPU-bound pure Python + numpy (no torch); threads of one process
share its interpreter lock, so a thread pool plans on one core however many it has. The pool
starts `workers` processes (default: the cores the server may run on) that run any job, and one
more that runs only small jobs, from a `forkserver` that has imported the planner once, so a worker
that is replaced starts in milliseconds; each keeps its pricing memos (`cost_models.interning`)
across jobs. A worker dies with the server (PR_SET_PDEATHSIG on the forkserver's children; the
forkserver exits when the server's end of its pipe closes).

Queue (`PlannerPool.submit`). A job's size is the work estimate the route computed before queueing
(`planner.budget.estimate_work`, layouts); a *large* job enumerates over `SMALL_LAYOUTS`. Small jobs
go first, oldest first (each is short), and a large job that has waited `PROMOTE_S` goes ahead of
younger small ones; the small-job worker never takes a large one, so a tiny plan behind four slow
ones waits for none of them (the operating system shares the cores between it and the others). Bounds, each a 503 with
Retry-After: at most `max_pending` jobs queued or running; a large job is refused when the large
jobs already waiting would take the workers longer than one time budget to start (their count x
the running mean of large jobs' seconds / `workers`), or when `max_pending_large` (if set) are
queued or running. Retry-After is the work ahead over the workers that do it.

Time budget: a job may run `time_budget_s` seconds. The search checks it cooperatively (its
`progress` callback runs once per (mesh, micro-batch) pair and raises `Stopped` past the deadline
or when the job is cancelled); a worker still busy `GRACE_S` after the deadline or the
cancellation (an evaluation, or a search in a phase without progress calls) is killed with
SIGKILL and replaced. A stopped search stores nothing: the route answers 422 saying how far it
got. Cancellation: `run` polls whether the client is still connected while the job is queued or
running; a client that left cancels its job (removed from the queue, or stopped as above).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import multiprocessing
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from pydantic import ValidationError

from api.errors import ApiError
from api.metrics import Metrics
from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration
from cost_models.jobs import Job
from cost_models.kernels.schema import AtlasFile
from model_specs.spec import ModelSpec, TrainingSpec
from planner.plan import Plan, SearchConstraints

log = logging.getLogger("autopar.api")

SMALL_LAYOUTS = 2**17
"""A job whose search enumerates at most this many layouts (131,072) is small: it takes well under
a second (tiny on 4 ranks: 23 layouts; Llama-3-8B on 8 H100: 10,770; Llama-3-70B on 1,024 H100,
343,278 layouts, took 0.6 s on one core of this machine, `bench.plan_speed`) and may run on every
worker; a larger one never takes the last one."""
PROMOTE_S = 10.0
"""Seconds a large job waits before it goes ahead of small ones queued after it: small jobs first
(each is short) without starving the large ones."""
GRACE_S = 5.0
"""Seconds a worker gets, past its deadline or its cancellation, to stop on its own before it is
killed (a search stops within one (mesh, micro-batch) pair, milliseconds)."""
POLL_S = 0.05
"""How often a dispatcher looks at its worker, and `run` at the client's connection (seconds)."""
FORKSERVER_PRELOAD = ["api.planning", "planner.search", "planner.partitioner", "cost_models.jobs"]
"""Modules the forkserver imports once, so that every worker starts with them loaded."""


class Stopped(Exception):
    """Raised inside a worker's search by its progress callback: the job's time budget ended or
    the job was cancelled."""


@dataclass
class _Job:
    kind: str  # "search" | "evaluate" | "calibrate"
    payload: tuple[Any, ...]
    layouts: int
    large: bool
    future: Future[Any] = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)
    why_cancelled: str = ""
    queued_at: float = field(default_factory=time.monotonic)


def _die_with_parent() -> None:
    """Ask the kernel for SIGKILL when this process's parent dies (Linux prctl PR_SET_PDEATHSIG = 1,
    prctl(2); nothing elsewhere). The runtime's workers do the same (`runtime.process`), which the
    service does not import."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _worker_main(conn: Connection, stop_flag: Any) -> None:
    """A worker process: read (kind, payload, budget_s) from `conn`, answer with the outcome, until
    the pipe closes. `stop_flag.value` is set to 1 by the server to cancel the job at hand."""
    import signal

    _die_with_parent()  # dies with the forkserver, which exits with the server
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of `autopar serve` is the server's to handle
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        kind, payload, budget_s = message
        started = time.monotonic()
        try:
            if kind == "search":
                outcome: tuple[Any, ...] = ("ok", _search(payload, started + budget_s, stop_flag))
            elif kind == "calibrate":
                outcome = ("ok", _calibrate(payload))
            else:
                outcome = ("ok", _evaluate(payload))
        except Stopped as exc:
            outcome = ("stopped", str(exc))
        except ApiError as exc:
            outcome = ("error", exc.status, exc.items, exc.headers)
        except Exception as exc:  # noqa: BLE001 - reported to the server, which logs and answers 500
            log.exception("planner worker failed on a %s job", kind)
            outcome = ("crash", f"{type(exc).__name__}: {exc}")
        try:
            conn.send((*outcome, time.monotonic() - started))
        except (EOFError, OSError):
            return


def _search(payload: tuple[Any, ...], deadline: float, stop_flag: Any) -> Plan:
    # a fine-tuning job is planned in its stack, its techniques searched (`planner.finetune`); any
    # other job goes to `planner.search.search` unchanged
    from planner.kernel_profile import search_with_profile

    model, training, cluster, gpus, constraints, calibration, atlas = payload
    visited = [0, 0]

    def progress(done: int, total: int) -> None:
        visited[0], visited[1] = done, total
        if stop_flag.value:
            raise Stopped(f"cancelled after {done:,} of {total:,} (mesh, micro-batch) pairs")
        if time.monotonic() > deadline:
            raise Stopped(f"time budget ended after {done:,} of {total:,} (mesh, micro-batch) pairs")

    try:
        # with the cluster's measured kernel profile (`api.atlas`) layered over the shipped atlas
        return search_with_profile(model, training, cluster, gpus, constraints, atlas, calibration=calibration,
                                   progress=progress)
    except Stopped:
        raise
    except (ValueError, ArithmeticError, KeyError, IndexError, TypeError) as exc:
        # search() reports impossible jobs in the Plan; an exception here comes from an inline spec
        # the planner cannot price. The input's fault as far as the caller can tell, but logged in
        # full so that a planner bug does not hide behind a 422.
        log.exception("planner search failed for model %s on %s x %d", model.name, cluster.name, gpus)
        raise ApiError(422, f"the planner cannot price this job: {type(exc).__name__}: {exc}", ["body"],
                       "unplannable") from exc


def _calibrate(payload: tuple[Any, ...]) -> Any:
    """A cluster's fit with its error report (`cost_models.profile_calibration`, `api.calibration`)."""
    from cost_models.profile_calibration import fit_cluster_calibration

    cluster, pairs = payload
    return fit_cluster_calibration(cluster, pairs, errors=True)


def _evaluate(payload: tuple[Any, ...]) -> dict[str, Any]:
    """Price the job's layout (as `cost_models.jobs.run_job` does, with the cluster's calibration)."""
    from cost_models.auto_knobs import AutoError
    from cost_models.jobs import JobError, price_job
    from cost_models.layout import LayoutError
    from cost_models.stages import StagePartition
    from planner.partitioner import cp_sat_partitioner

    job, model, cluster, calibration, atlas = payload
    if atlas is not None:  # the cluster's measured kernel profile over the shipped atlas (`api.atlas`)
        from cost_models.kernels.overlay import profiled_cluster

        cluster = profiled_cluster(cluster, atlas)
    try:
        if isinstance(job.partition, list) and not job.auto:
            lay = job.layout.resolved(job.gpus, job.training)
            try:
                StagePartition.explicit(job.partition, lay)
            except ValueError as exc:
                raise ApiError(422, str(exc), ["body", "partition"], "value_error") from exc
        result: dict[str, Any] = price_job(job, model, cluster, calibration, partitioner=cp_sat_partitioner)
        if atlas is not None and atlas.provenance is not None:
            from cost_models.kernels.overlay import digest

            result["kernel_profile"] = {"gpu": atlas.gpu, "digest": digest(atlas), "device": atlas.provenance.device,
                                        "measured_at": atlas.provenance.measured_at}
        return result
    except (AutoError, JobError) as exc:
        raise ApiError(422, str(exc), ["body", "layout"], "value_error") from exc
    except LayoutError as exc:
        err = ApiError(422, "invalid layout", ["body", "layout"], "layout")
        err.items = [{"loc": ["body", *v.path], "msg": v.message, "type": "layout"} for v in exc.violations]
        raise err from exc
    except ValidationError as exc:
        raise ApiError.from_validation(exc, ["body"]) from exc
    except (ValueError, ArithmeticError, KeyError, IndexError, TypeError) as exc:
        log.exception("evaluation failed for model %s on %s x %d", model.name, cluster.name, job.gpus)
        raise ApiError(422, f"cannot price this layout: {type(exc).__name__}: {exc}", ["body"], "unpriceable") from exc


class _Slot:
    """One worker process and the dispatcher thread that feeds it jobs and watches them."""

    def __init__(self, pool: PlannerPool, index: int, may_run_large: bool):
        self.pool, self.index, self.may_run_large = pool, index, may_run_large
        self.stop_flag = pool.ctx.RawValue("b", 0)
        self.process: Any = None
        self.conn: Connection | None = None
        self.job: _Job | None = None
        self.thread = threading.Thread(target=self._dispatch, name=f"autopar-plan-{index}", daemon=True)
        self.thread.start()  # it starts the worker first: the server answers while workers start

    def _spawn(self) -> None:
        parent, child = self.pool.ctx.Pipe()
        self.process = self.pool.ctx.Process(
            target=_worker_main, args=(child, self.stop_flag), name=f"autopar-planner-{self.index}", daemon=True
        )
        self.process.start()
        child.close()
        self.conn = parent

    def _replace(self) -> None:
        """Kill the worker (it overran its budget, or died) and start a fresh one."""
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.join(5.0)
        with contextlib.suppress(Exception):
            assert self.conn is not None
            self.conn.close()
        self.pool.metrics.planner_worker_restarts.inc()
        if not self.pool.stopping:
            self._spawn()

    def _dispatch(self) -> None:
        try:
            self._spawn()
        except Exception:  # noqa: BLE001 - retried when the first job is sent
            log.exception("planner worker %d did not start", self.index)
        while True:
            job = self.pool._take(self)
            if job is None:
                return
            self.job = job
            try:
                outcome = self._run(job)
            except Exception as exc:  # noqa: BLE001 - a broken pipe to a dead worker
                log.exception("planner worker %d failed", self.index)
                outcome = ("crash", f"{type(exc).__name__}: {exc}", 0.0)
            finally:
                self.job = None
                self.pool._done(job)
            self.pool._settle(job, outcome)

    def _run(self, job: _Job) -> tuple[Any, ...]:
        budget = self.pool.time_budget_s
        self.stop_flag.value = 0
        try:
            assert self.conn is not None
            self.conn.send((job.kind, job.payload, budget))
        except (AssertionError, BrokenPipeError, OSError):
            self._replace()
            assert self.conn is not None
            self.conn.send((job.kind, job.payload, budget))
        started = time.monotonic()
        stop_at: float | None = None  # when the worker was told to stop
        why = ""
        while True:
            if self.conn.poll(POLL_S):
                try:
                    return tuple(self.conn.recv())
                except (EOFError, OSError):
                    self._replace()
                    return ("crash", "the planner worker died", time.monotonic() - started)
            now = time.monotonic()
            if not self.process.is_alive():
                self._replace()
                return ("crash", f"the planner worker died (exit code {self.process.exitcode})", now - started)
            if stop_at is None and job.cancelled.is_set():
                why, stop_at = job.why_cancelled, now
                self.stop_flag.value = 1  # the search stops at its next progress call
            elif stop_at is None and now - started > budget:
                why, stop_at = "budget", now  # the search stops itself at its own deadline
            if stop_at is not None and now - stop_at > GRACE_S:
                self._replace()
                return ("killed", why, now - started)


class PlannerPool:
    def __init__(
        self, workers: int, max_pending: int, metrics: Metrics, *, time_budget_s: float = 60.0,
        max_pending_large: int | None = None,
    ):
        self.workers = max(1, workers)
        self.max_pending = max(1, max_pending)
        self.max_pending_large = None if max_pending_large is None else max(1, max_pending_large)
        self.time_budget_s = float(time_budget_s)
        self.metrics = metrics
        self.stopping = False
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self._cond = threading.Condition()
        self._queue: list[_Job] = []
        self._running = 0
        self._large = 0
        self._mean_s = {False: 1.0, True: 10.0}  # running mean of small and large job seconds (Retry-After)
        # slot 0 runs small jobs only; slots 1..workers run any job
        self._slots = [_Slot(self, i, may_run_large=i > 0) for i in range(self.workers + 1)]

    # ---- the server's side ------------------------------------------------------------------------
    def submit(self, kind: str, payload: tuple[Any, ...], layouts: int) -> _Job:
        """Queue a job, or raise 503 (with Retry-After) when the queue is full."""
        large = layouts > SMALL_LAYOUTS
        with self._cond:
            pending = len(self._queue) + self._running
            if pending >= self.max_pending:
                self.metrics.planner_rejected.inc()
                wait = self._retry_after(sum(self._mean_s[j.large] for j in self._queue), self.workers)
                raise ApiError(503, f"{pending} planner jobs already queued or running; retry in {wait} s", [],
                               "planner_busy", {"Retry-After": str(wait)})
            if large:
                waiting = sum(1 for j in self._queue if j.large)
                start_in = waiting * self._mean_s[True] / self.workers  # seconds until this one would start
                capped = self.max_pending_large is not None and self._large >= self.max_pending_large
                if capped or start_in > self.time_budget_s:
                    self.metrics.planner_rejected.inc()
                    ahead = max(start_in - self.time_budget_s, self._mean_s[True] / self.workers)
                    wait = self._retry_after(ahead, 1)
                    raise ApiError(
                        503, f"{self._large} large searches (over {SMALL_LAYOUTS:,} layouts each) already queued or "
                        f"running; retry in {wait} s", [], "planner_busy", {"Retry-After": str(wait)},
                    )
            job = _Job(kind, payload, layouts, large)
            self._queue.append(job)
            self._large += large
            self._gauge()
            self._cond.notify_all()
        return job

    async def run(
        self, kind: str, payload: tuple[Any, ...], layouts: int,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> Any:
        """Queue a job and wait for its result; cancel it if `disconnected()` turns true first."""
        job = self.submit(kind, payload, layouts)
        waiter = asyncio.wrap_future(job.future)
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=POLL_S * 4)
            if done:
                return waiter.result()
            if disconnected is not None and await disconnected():
                self.cancel(job, "the client disconnected")
                with contextlib.suppress(Exception):
                    await waiter
                raise ApiError(499, "the client closed the request; the job was cancelled and nothing stored", [],
                               "client_closed")

    def _retry_after(self, seconds_of_work: float, workers: int) -> int:
        """Retry-After (whole seconds, 1 to the time budget) for `seconds_of_work` spread over `workers`."""
        return int(min(max(1, math.ceil(seconds_of_work / workers)), math.ceil(self.time_budget_s)))

    def cancel(self, job: _Job, why: str) -> None:
        """Cancel a job: dropped if still queued, else stopped by its dispatcher."""
        with self._cond:
            job.why_cancelled = why
            job.cancelled.set()
            if job in self._queue:
                self._queue.remove(job)
                self._large -= job.large
                self._gauge()
                self.metrics.planner_cancelled.inc()
                job.future.set_exception(ApiError(499, f"cancelled before it started: {why}", [], "client_closed"))

    def shutdown(self) -> None:
        with self._cond:
            self.stopping = True
            for job in self._queue:
                job.future.set_exception(ApiError(503, "the server is shutting down", [], "shutting_down"))
            self._queue.clear()
            self._cond.notify_all()
        for slot in self._slots:
            with contextlib.suppress(Exception):
                assert slot.conn is not None
                slot.conn.close()
            with contextlib.suppress(Exception):
                slot.process.kill()
                slot.process.join(2.0)

    # ---- the dispatchers' side ----------------------------------------------------------------------
    def _take(self, slot: _Slot) -> _Job | None:
        """The next job `slot` may run (blocks; None when the pool stops): the oldest small job, or a
        large one that has waited `PROMOTE_S` (then the oldest such), else the oldest large one."""
        with self._cond:
            while True:
                if self.stopping:
                    return None
                now = time.monotonic()
                runnable = [j for j in self._queue if slot.may_run_large or not j.large]
                if runnable:
                    job = min(runnable, key=lambda j: (j.large and now - j.queued_at < PROMOTE_S, j.queued_at))
                    self._queue.remove(job)
                    self._running += 1
                    self._gauge()
                    self.metrics.planner_queue_seconds.observe(now - job.queued_at)
                    return job
                self._cond.wait()

    def _done(self, job: _Job) -> None:
        with self._cond:
            self._running -= 1
            self._large -= job.large
            self._gauge()
            self._cond.notify_all()

    def _gauge(self) -> None:
        self.metrics.planner_pending.set(len(self._queue) + self._running)

    def _settle(self, job: _Job, outcome: tuple[Any, ...]) -> None:
        """Turn a worker's outcome into the job's result or exception."""
        kind, *rest = outcome
        seconds = float(rest[-1]) if rest else 0.0
        self._mean_s[job.large] = 0.8 * self._mean_s[job.large] + 0.2 * seconds
        if job.kind == "search":
            self.metrics.search_seconds.observe(seconds)
        if job.future.done():  # cancelled while queued: nothing to report
            return
        if kind == "ok":
            job.future.set_result(rest[0])
            return
        if kind == "error":
            status, items, headers = rest[0], rest[1], rest[2]
            if items and items[0].get("type") in ("unplannable", "unpriceable"):
                self.metrics.planner_errors.inc()
            err = ApiError(status, items[0]["msg"] if items else "error", [], headers=headers)
            err.items = items
            job.future.set_exception(err)
            return
        if job.cancelled.is_set():
            self.metrics.planner_cancelled.inc()
            job.future.set_exception(ApiError(499, f"cancelled: {job.why_cancelled}", [], "client_closed"))
            return
        if kind in ("stopped", "killed"):
            self.metrics.planner_over_budget.inc()
            got = rest[0] if kind == "stopped" else f"killed: it did not stop within {GRACE_S:g} s of its deadline"
            job.future.set_exception(ApiError(
                422, f"the {job.kind} did not finish within its time budget of {self.time_budget_s:g} s ({got}); "
                f"nothing was stored. Narrow it: pin constraints (tp, pp, cp, ep, micro_batch, zero_stage, "
                f"recompute) or plan fewer GPUs", ["body"], "over_time_budget",
            ))
            return
        self.metrics.planner_errors.inc()
        log.error("planner worker crashed on a %s job: %s", job.kind, rest[0])
        job.future.set_exception(ApiError(500, f"the planner worker failed ({rest[0]})", [], "internal_error"))


def request_sha256(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def search_payload(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, constraints: SearchConstraints,
    calibration: Calibration, atlas: AtlasFile | None = None,
) -> tuple[Any, ...]:
    """What a search job carries to its worker; `atlas`: the cluster's measured kernel profile."""
    return (model, training, cluster, gpus, constraints, calibration, atlas)


def evaluation_payload(job: Job, model: ModelSpec, cluster: ClusterSpec, calibration: Calibration,
                       atlas: AtlasFile | None = None) -> tuple[Any, ...]:
    """What an evaluation job carries to its worker; `atlas`: the cluster's measured kernel profile."""
    return (job, model, cluster, calibration, atlas)
