"""The runner agent: register, lease, launch, heartbeat, upload, finish (the protocol:
docs/architecture.md, "Service and runner agent").

One attempt of a run, in the agent's work dir `WORKDIR/run-<id>/attempt-<n>/`:
    plan.json          the leased Plan, written as data (the runtime reads it; nothing interprets it)
    child.log          stdout + stderr of torchrun and its workers (the log tail sent on finish)
    child.json         the running child tree: its leader's pid (= process group) and start time,
                       and the agent process that started it (`agent.launcher.ChildRecord`);
                       deleted once the tree is gone
    progress.json      step progress, rewritten by the runtime after every step
    preflight.json     the pre-flight all-reduce result (when asked for)
    kernel-profile.json the plan's kernels measured on this node (`autopar profile`, when asked for),
                       uploaded as the cluster's kernel profile (PUT /v1/clusters/{name}/atlas)
    profile.json       the runtime's Profile
    idempotency_key    the key of the profile upload, derived from (server, run id, attempt) and
                       kept, so a retried or resumed upload reuses it
    outcome.json       what the agent reported at the end

While the child runs, a heartbeat thread posts progress every lease/3 seconds; an answer with
`cancel_requested` or a 409 (the lease is no longer this attempt's) stops the child's whole
process group. A lost lease is not reported further: the run belongs to another attempt now. A
401 or 403 (the agent's token was revoked) stops the child too, and the agent: nothing it does
for that token will be accepted any more.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.client import ApiClient, ProtocolError, RetryPolicy, ServerUnavailable
from agent.launcher import (
    Child,
    LaunchError,
    LaunchSpec,
    kernel_profile_argv,
    log_tail,
    preflight_argv,
    read_progress,
    reap_leftovers,
    runtime_argv,
)
from agent.lease import Lease, LeaseRefused, files_outside

log = logging.getLogger("autopar.agent")

PREFLIGHT_KEYS = ("bus_bandwidth_bytes_per_s", "collective", "bytes", "ranks")


@dataclass
class AgentConfig:
    server: str
    token: str
    cluster: str
    workdir: Path
    name: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    poll_s: float = 2.0
    once: bool = False
    preflight: bool = False
    preflight_bytes: int = 4 * 2**20
    preflight_iters: int = 10
    preflight_timeout_s: float = 120.0
    profile_kernels: bool = False  # measure each new plan's kernels and store them as the cluster's profile
    profile_max_seconds: float = 300.0
    heartbeat_s: float | None = None  # default: a third of the run's lease
    stop_grace_s: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    report_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(tries=16, max_elapsed_s=300.0))


def idempotency_key(adir: Path, server: str, run_id: str, attempt: int) -> str:
    """The profile upload's key: uuid5 of (server, run, attempt), persisted in the attempt dir."""
    path = adir / "idempotency_key"
    if path.exists():
        return path.read_text().strip()
    key = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{server}/v1/runs/{run_id}/attempts/{attempt}"))
    path.write_text(key)
    return key


class Heartbeat(threading.Thread):
    """Posts the attempt's progress until stopped; records why the child must stop, if it must."""

    def __init__(self, client: ApiClient, run_id: str, agent_id: Any, attempt: int, interval_s: float,
                 progress_file: Path, steps: int):
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self.client, self.run_id, self.agent_id, self.attempt = client, run_id, agent_id, attempt
        self.interval_s = interval_s
        self.progress_file, self.steps = progress_file, steps
        self.message = "starting"
        self.stop_reason: str | None = None  # "cancelled" | "lease_lost" | "unauthorized"
        self.beats = 0
        self._halt = threading.Event()
        self.first_done = threading.Event()
        # a heartbeat must not outlive its own period in retries: a late beat is worth nothing
        self._retry = RetryPolicy(tries=4, max_elapsed_s=max(1.0, interval_s), base_s=0.25, cap_s=2.0)

    def progress(self) -> dict[str, Any]:
        p = read_progress(self.progress_file)
        if p is None:
            return {"step": 0, "steps": self.steps, "loss": None, "message": self.message}
        return {**p, "message": self.message}

    def beat(self) -> None:
        try:
            r = self.client.heartbeat(self.run_id, self.agent_id, self.attempt, self.progress(), retry=self._retry)
        except ServerUnavailable as exc:
            log.warning("heartbeat: %s", exc)
            return
        if r.status_code == 200:
            self.beats += 1
            if _answer_field(r, "cancel_requested") is True:
                self.stop_reason = "cancelled"
        elif r.status_code in (404, 409):
            self.stop_reason = "lease_lost"
        elif r.status_code in (401, 403):
            log.error("heartbeat: HTTP %s %s: the token was revoked; stopping the run", r.status_code, r.text[:200])
            self.stop_reason = "unauthorized"
        else:
            log.warning("heartbeat: HTTP %s %s", r.status_code, r.text[:200])

    def run(self) -> None:
        while not self._halt.is_set() and self.stop_reason is None:
            self.beat()
            self.first_done.set()
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=self._retry.max_elapsed_s + 35.0)


def _answer_field(response: Any, key: str) -> Any:
    """`key` of a JSON object answer; None when the answer is not one (logged, never raised)."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        log.warning("heartbeat: answer is not a JSON object: %s", response.text[:200])
        return None
    return data.get(key)


def _finite(x: Any) -> Any:
    """JSON has no NaN/Infinity: replace them (recursively) with null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


class Agent:
    def __init__(self, cfg: AgentConfig, client: ApiClient | None = None):
        self.cfg = cfg
        self.client = client or ApiClient(cfg.server, cfg.token, retry=cfg.retry)
        self.agent_id: Any = None
        self.terminate = threading.Event()  # set by SIGTERM / SIGINT: stop the child, report, exit
        self.revoked = False  # the server refused the token (401 / 403): stop and exit with 1
        self.uid = uuid.uuid4().hex  # this agent process, in the records of the children it starts
        self.profiled: set[str] = set()  # plans whose kernels this agent measured and stored

    # ---- loop ------------------------------------------------------------------------------------
    def register(self) -> Any:
        while True:
            try:
                info = self.client.register(self.cfg.name, self.cfg.cluster, socket.gethostname())
                self.agent_id = info["id"]
                log.info("registered as agent %s for cluster %s", self.agent_id, self.cfg.cluster)
                return self.agent_id
            except ServerUnavailable as exc:
                if self.cfg.once or self.terminate.is_set():
                    raise
                log.warning("register: %s; trying again", exc)
                self.terminate.wait(self.cfg.poll_s)

    def run_forever(self) -> int:
        """Lease and execute runs until terminated (or, with `once`, after one poll/run).
        Returns the process exit code: 0, or 1 when `once` ended in a failure to talk to the server."""
        self.cfg.workdir.mkdir(parents=True, exist_ok=True)
        for pgid in reap_leftovers(self.cfg.workdir):
            log.warning("killed process group %d left by an earlier agent in %s", pgid, self.cfg.workdir)
        try:
            self.register()
        except (ServerUnavailable, ProtocolError) as exc:
            log.error("cannot register: %s", exc)
            return 1
        while not self.terminate.is_set():
            try:
                leased = self.client.lease(self.agent_id)
            except ServerUnavailable as exc:
                log.warning("lease: %s", exc)
                if self.cfg.once:
                    return 1
                self.terminate.wait(self.cfg.poll_s)
                continue
            except ProtocolError as exc:
                log.error("lease: %s", exc)
                if self.cfg.once or exc.status_code in (401, 403):
                    return 1
                self.terminate.wait(self.cfg.poll_s)
                continue
            if leased is not None:
                self.execute(leased)
            if self.revoked:
                log.error("the server refused this agent's token (revoked?): exiting")
                return 1
            if self.cfg.once:
                return 0
            if leased is None:
                self.terminate.wait(self.cfg.poll_s)
        return 0

    # ---- one attempt ---------------------------------------------------------------------------
    def execute(self, leased: Any) -> str:
        """Run one leased attempt to its end; returns the outcome reported ("lease_lost" when the
        lease was lost, "refused" when the answer was too malformed to name its run)."""
        try:
            lease = Lease.parse(leased)
        except LeaseRefused as exc:
            return self._refuse(exc)
        outside = files_outside(lease.plan, self.cfg.workdir / f"run-{lease.run_id}" / f"attempt-{lease.attempt}")
        if outside:
            return self._refuse(LeaseRefused("; ".join(outside), (lease.run_id, lease.attempt)))
        outcome = self._run_attempt(lease)
        log.info("run %s attempt %d: %s", lease.run_id, lease.attempt, outcome)
        return outcome

    def _run_attempt(self, lease: Lease) -> str:
        run, plan, attempt = lease.run.model_dump(), lease.plan, lease.attempt
        run_id = lease.run_id  # `Lease.parse` refused any id that is not a safe directory name
        adir = self._attempt_dir(run_id, attempt)
        plan_file = adir / "plan.json"
        plan_file.write_text(json.dumps(plan))
        try:
            spec = LaunchSpec.from_run(run, plan)
        except LaunchError as exc:
            return self._finish(adir, run_id, attempt, "failed", f"agent refused to launch: {exc}\n", None)
        lease_s = float(lease.run.lease_seconds)
        interval = self.cfg.heartbeat_s or max(0.5, lease_s / 3.0)
        progress_file = adir / "progress.json"
        hb = Heartbeat(self.client, run_id, self.agent_id, attempt, interval, progress_file, spec.steps)
        hb.start()
        hb.first_done.wait(timeout=interval + 5.0)
        preflight: dict[str, Any] | None = None
        code: int | None = None
        reason: str | None = hb.stop_reason
        try:
            if reason is None and self.cfg.preflight and spec.nproc_per_node > 1:
                hb.message = "pre-flight all-reduce"
                out = adir / "preflight.json"
                argv = preflight_argv(spec, out, self.cfg.preflight_bytes, self.cfg.preflight_iters)
                pcode, reason = self._supervise(argv, adir, "preflight.log", hb, self.cfg.preflight_timeout_s)
                if pcode == 0 and out.exists():
                    data = json.loads(out.read_text())
                    preflight = {k: data[k] for k in PREFLIGHT_KEYS}
                    hb.message = f"pre-flight bus bandwidth {data['bus_bandwidth_bytes_per_s'] / 1e9:.3f} GB/s"
            if reason is None and self.cfg.profile_kernels:
                reason = self._profile_kernels(plan, plan_file, adir, hb)
            if reason is None:
                hb.message = "training"
                argv = runtime_argv(spec, plan_file, adir / "profile.json", progress_file)
                code, reason = self._supervise(argv, adir, "child.log", hb, None)
        finally:
            hb.stop()
        reason = reason or hb.stop_reason
        tail = log_tail(adir / "child.log")
        if reason == "unauthorized":
            self.revoked = True
            (adir / "outcome.json").write_text(json.dumps({"outcome": "token_refused", "exit_code": code}))
            log.error("run %s attempt %d: the token was refused; child stopped, nothing reported", run_id, attempt)
            return "token_refused"
        if reason == "lease_lost":
            (adir / "outcome.json").write_text(json.dumps({"outcome": "lease_lost", "exit_code": code}))
            log.warning("run %s attempt %d: lease lost; child stopped, nothing reported", run_id, attempt)
            return "lease_lost"
        if reason == "cancelled":
            return self._finish(adir, run_id, attempt, "cancelled", tail, code)
        if reason == "terminated":
            return self._finish(adir, run_id, attempt, "failed", tail + "\nagent terminated by signal\n", code)
        profile_file = adir / "profile.json"
        if code == 0 and profile_file.exists():
            profile = json.loads(profile_file.read_text())
            if preflight is not None:
                profile["preflight"] = preflight
            try:
                self._upload(adir, run_id, attempt, _finite(profile))
            except (ServerUnavailable, ProtocolError) as exc:
                return self._finish(adir, run_id, attempt, "failed", tail + f"\nprofile upload failed: {exc}\n", code)
            return self._finish(adir, run_id, attempt, "succeeded", tail, code)
        return self._finish(adir, run_id, attempt, "failed", tail, code)

    def _profile_kernels(self, plan: dict[str, Any], plan_file: Path, adir: Path, hb: Heartbeat) -> str | None:
        """The pre-flight kernel profile (`AgentConfig.profile_kernels`): the leased plan's kernels
        measured on this node (`runtime.kernel_profile`, within `profile_max_seconds`) and uploaded
        as the cluster's profile, once per distinct plan this agent serves. A failure to measure or
        to store it is logged and leaves the run to go on; returns the supervisor's stop reason."""
        key = json.dumps(plan.get("inputs"), sort_keys=True) + json.dumps((plan.get("best") or {}).get("layout"),
                                                                           sort_keys=True)
        if key in self.profiled:
            return None
        hb.message = "kernel profile"
        out = adir / "kernel-profile.json"
        argv = kernel_profile_argv(plan_file, out, self.cfg.profile_max_seconds)
        code, reason = self._supervise(argv, adir, "kernel-profile.log", hb, self.cfg.profile_max_seconds + 120.0)
        if reason is not None:
            return reason
        if code != 0 or not out.exists():
            log.error("kernel profile failed (exit %s); see %s", code, adir / "kernel-profile.log")
            return None
        try:
            r = self.client.put_atlas(self.cfg.cluster, json.loads(out.read_text()), retry=self.cfg.report_retry)
        except (ServerUnavailable, ValueError) as exc:
            log.error("kernel profile upload failed: %s", exc)
            return None
        if r.status_code == 200:
            self.profiled.add(key)
            hb.message = "kernel profile stored"
        else:
            log.error("kernel profile upload: HTTP %s %s", r.status_code, r.text[:300])
        (adir / "kernel_profile_http").write_text(str(r.status_code))
        return None

    def _attempt_dir(self, run_id: str, attempt: int) -> Path:
        adir = self.cfg.workdir / f"run-{run_id}" / f"attempt-{attempt}"
        adir.mkdir(parents=True, exist_ok=True)
        return adir

    def _refuse(self, exc: LeaseRefused) -> str:
        """A malformed lease: finish its attempt as failed with the reason when the answer names the
        run and the attempt; otherwise log it (the server re-queues the run when the lease expires)."""
        reason = f"agent refused the leased run: malformed lease answer: {exc}\n"
        if exc.identity is None:
            log.error("%s(it names no valid run id and attempt: nothing to report to)", reason)
            return "refused"
        run_id, attempt = exc.identity
        log.error("run %s attempt %d: %s", run_id, attempt, reason.strip())
        return self._finish(self._attempt_dir(run_id, attempt), run_id, attempt, "failed", reason, None)

    def _supervise(
        self, argv: list[str], adir: Path, log_name: str, hb: Heartbeat, timeout_s: float | None
    ) -> tuple[int | None, str | None]:
        """Run a child until it exits, the heartbeat says stop, the agent is terminated, or the
        timeout passes. Returns (exit code, stop reason or None)."""
        child = Child(argv, adir, log_name, agent_id=self.uid)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                code = child.wait(0.2)
                if code is not None:
                    return code, None
                why = hb.stop_reason or ("terminated" if self.terminate.is_set() else None)
                if why is None and deadline is not None and time.monotonic() > deadline:
                    why = "timeout"
                if why is not None:
                    code = child.stop(self.cfg.stop_grace_s)
                    return code, (None if why == "timeout" else why)
        finally:
            child.close()

    def _upload(self, adir: Path, run_id: str, attempt: int, profile: dict[str, Any]) -> dict[str, Any]:
        key = idempotency_key(adir, self.cfg.server, run_id, attempt)
        stored = self.client.put_profile(run_id, self.agent_id, attempt, profile, key, retry=self.cfg.report_retry)
        (adir / "profile_uploaded").write_text(key)
        return stored

    def _finish(self, adir: Path, run_id: str, attempt: int, status: str, tail: str, code: int | None) -> str:
        outcome: dict[str, Any] = {"outcome": status, "exit_code": code}
        try:
            r = self.client.finish(run_id, self.agent_id, attempt, status, tail, code, retry=self.cfg.report_retry)
            outcome["finish_http"] = r.status_code
            if r.status_code == 409:
                status = "lease_lost"
            elif r.status_code in (401, 403):
                self.revoked = True
                log.error("finish: HTTP %s %s", r.status_code, r.text[:300])
            elif r.status_code != 200:
                log.error("finish: HTTP %s %s", r.status_code, r.text[:300])
        except ServerUnavailable as exc:
            outcome["finish_error"] = str(exc)
            log.error("finish: %s", exc)
        (adir / "outcome.json").write_text(json.dumps(outcome))
        return status
