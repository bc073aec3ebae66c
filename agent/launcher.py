"""Launch the runtime (or the pre-flight) as a child process tree, watch it, stop it.

The child is started from an argv list (never a shell, never a string built from request data):
every element is either a constant, a path the agent made, or a validated integer / enum from the
leased run (`LaunchSpec.from_run`). It runs in its own session, hence its own process group, so
`stop()` reaches torchrun and every worker it forked with one `killpg`. Its stdout and stderr go
to `child.log` in the attempt's work dir; `child.pid` records the group id there (a supervisor,
or the end-to-end test acting as a node crash, can find the tree). The tree dies with the agent:
torchrun and every runtime worker ask for SIGKILL when their parent dies
(`set_parent_death_signal`), and an agent that starts reaps the groups an earlier one left in its
work dir (`reap_leftovers`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.process import set_parent_death_signal

BACKENDS = ("auto", "gloo", "nccl")
MAX_STEPS = 1_000_000  # the API's bound on a run's `steps`
MAX_NPROC = 1024  # the API's bound on `launch.nproc_per_node`
LOG_TAIL_BYTES = 64 * 1024  # the contract's limit on log_tail
SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A run id the agent uses as a directory name (ints, uuids): the one rule for leases and launches."""


class LaunchError(ValueError):
    """The leased run asks for something the agent will not launch."""


def _int_in(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise LaunchError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


@dataclass(frozen=True)
class LaunchSpec:
    """What the agent launches for a leased run: validated, typed, nothing else."""

    steps: int
    nproc_per_node: int
    backend: str

    @classmethod
    def from_run(cls, run: dict[str, Any], plan: dict[str, Any]) -> LaunchSpec:
        launch = run.get("launch") or {}
        backend = launch.get("backend") or "auto"
        if backend not in BACKENDS:
            raise LaunchError(f"launch.backend must be one of {BACKENDS}, got {backend!r}")
        nproc = launch.get("nproc_per_node")
        if nproc is None:
            nproc = (plan.get("inputs") or {}).get("gpus") or plan.get("gpus")
        return cls(
            steps=_int_in(run.get("steps", 10), "steps", 1, MAX_STEPS),
            nproc_per_node=_int_in(nproc, "nproc_per_node", 1, MAX_NPROC),
            backend=backend,
        )


def torchrun_prefix(nproc: int) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node=N` (as `autopar run` builds it)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def runtime_argv(spec: LaunchSpec, plan_file: Path, profile_file: Path, progress_file: Path) -> list[str]:
    """The argv of `autopar run PLAN --steps S --out profile.json --backend B`, plus the progress file."""
    return [
        *torchrun_prefix(spec.nproc_per_node),
        "-m", "runtime.launch", str(plan_file), "--steps", str(spec.steps), "--out", str(profile_file),
        "--backend", spec.backend, "--progress-file", str(progress_file),
    ]


def preflight_argv(spec: LaunchSpec, out_file: Path, nbytes: int, iters: int) -> list[str]:
    return [
        *torchrun_prefix(spec.nproc_per_node),
        "-m", "agent.preflight", "--bytes", str(nbytes), "--iters", str(iters), "--backend", spec.backend,
        "--out", str(out_file),
    ]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("AUTOPAR_AGENT_TOKEN", None)  # the training job has no business with the agent's token
    return env


def reap_leftovers(workdir: Path) -> list[int]:
    """Kill the process groups that earlier agent processes left in `workdir` (each attempt dir
    records its tree's group id in `child.pid`): called when an agent starts, before it leases
    anything. Returns the groups that were still alive."""
    killed = []
    for pid_file in sorted(workdir.glob("run-*/attempt-*/child.pid")):
        try:
            pgid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if pgid <= 1:
            continue
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


class Child:
    """A running process tree in its own process group, logging to `log_path`."""

    def __init__(self, argv: list[str], workdir: Path, log_name: str = "child.log"):
        self.workdir = workdir
        self.log_path = workdir / log_name
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(  # argv list, shell=False: nothing is interpreted
            argv, cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env(), start_new_session=True, preexec_fn=set_parent_death_signal,
        )
        self.pgid = self.proc.pid  # a session leader's pid is its process group id
        (workdir / "child.pid").write_text(str(self.pgid))

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGTERM the whole group (torchrun forwards it to its workers), SIGKILL it after `grace_s`."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            code = self.wait(wait)
            if code is not None:
                break
        code = self.proc.wait()
        # stragglers that outlived the leader (workers re-parented to init) get the KILL too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        return code

    def close(self) -> None:
        self._log.close()

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        return log_tail(self.log_path, limit)


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last bytes of a log as text, at most `limit` bytes once UTF-8 encoded."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    while len(text.encode()) > limit:  # replacement characters can grow the text
        text = text[len(text) // 16 + 1 :]
    return text


def read_progress(path: Path) -> dict[str, Any] | None:
    """The runtime's progress file (runtime.launch --progress-file), or None if absent/partial."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    loss = data.get("loss")
    if not isinstance(loss, int | float) or not math.isfinite(loss):
        loss = None
    try:
        return {"step": int(data["step"]), "steps": int(data["steps"]), "loss": loss}
    except (KeyError, TypeError, ValueError):
        return None


def run_to_completion(argv: list[str], workdir: Path, log_name: str, timeout_s: float) -> int | None:
    """Run a short child (the pre-flight) in its own group; stop it after `timeout_s`."""
    child = Child(argv, workdir, log_name)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = child.wait(0.2)
            if code is not None:
                return code
        child.stop(grace_s=2.0)
        return None
    finally:
        child.close()
