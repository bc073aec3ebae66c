"""Launch the runtime (or the pre-flight) as a child process tree, watch it, stop it.

The child is started from an argv list (never a shell, never a string built from request data):
every element is either a constant, a path the agent made, or a validated integer / enum from the
leased run (`LaunchSpec.from_run`). It runs in its own session, hence its own process group, so
`stop()` reaches torchrun and every worker it forked with one `killpg`. Its stdout and stderr go
to `child.log` in the attempt's work dir.

What the agent kills is only ever what it started. `child.json` in the attempt dir records the
child (`ChildRecord`: its pid = process group id, its start time in clock ticks since boot, field
22 of /proc/<pid>/stat, the boot it started in, and the agent process that started it: a random
id, its pid and start time). While the agent waits on its child the leader's pid cannot be
reused: the agent looks at the exit without reaping it (waitid WNOWAIT), kills the group's
stragglers while the exited leader still holds the group id, and only then reaps it and deletes
`child.json`. The tree dies with the agent: torchrun and every runtime worker ask for SIGKILL when
their parent dies (`set_parent_death_signal`); an agent that starts reaps what an earlier one left
in its work dir (`reap_leftovers`): only processes of a recorded group, started no earlier than
the recorded leader in the same boot, each verified through a pidfd (a handle that cannot come to
mean another process) before it is signalled, and never the children of an agent that is still
running. A record that matches no process is deleted.
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

from cluster_specs.spec import MAX_GPUS_PER_NODE
from runtime.process import set_parent_death_signal

BACKENDS = ("auto", "gloo", "nccl")
MAX_STEPS = 1_000_000  # the API's bound on a run's `steps`
MAX_NPROC = MAX_GPUS_PER_NODE  # the API's bound on `launch.nproc_per_node`: one process per GPU of a node
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
        gpus = _int_in((plan.get("inputs") or {}).get("gpus"), "the plan's inputs.gpus", 1, MAX_NPROC)
        nproc = launch.get("nproc_per_node")
        if nproc is None:
            nproc = gpus
        nproc = _int_in(nproc, "nproc_per_node", 1, MAX_NPROC)
        if nproc != gpus:
            raise LaunchError(
                f"launch.nproc_per_node {nproc} is not the plan's {gpus} GPUs: the agent starts one process per GPU "
                "the plan was priced for, on this node"
            )
        return cls(steps=_int_in(run.get("steps", 10), "steps", 1, MAX_STEPS), nproc_per_node=nproc, backend=backend)


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


def kernel_profile_argv(plan_file: Path, out_file: Path, max_seconds: float) -> list[str]:
    """The argv of `autopar profile PLAN` (`runtime.kernel_profile`): one process on this node's device."""
    return [sys.executable, "-m", "runtime.kernel_profile", str(plan_file), "--out", str(out_file),
            "--max-seconds", f"{max_seconds:g}"]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("AUTOPAR_AGENT_TOKEN", None)  # the training job has no business with the agent's token
    return env


@dataclass(frozen=True)
class ProcessId:
    """A process as the kernel knows it for its lifetime: its pid and its start time (clock ticks
    after boot, /proc/<pid>/stat field 22) in one boot (/proc/sys/kernel/random/boot_id). A pid is
    reused after the process is gone; the pair is not."""

    pid: int
    start_ticks: int
    boot_id: str

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        stat = proc_stat(pid)
        return None if stat is None else cls(pid, stat.start_ticks, boot_id())

    def alive(self) -> bool:
        stat = proc_stat(self.pid)
        return stat is not None and stat.state != "Z" and stat.start_ticks == self.start_ticks and (
            self.boot_id == boot_id())


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    start_ticks: int


def proc_stat(pid: int) -> ProcStat | None:
    """The fields of /proc/<pid>/stat the agent reads, or None when there is no such process. The
    command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    rest = text.rsplit(")", 1)[1].split()
    # rest[0] is field 3 (state), rest[2] field 5 (pgrp), rest[19] field 22 (starttime)
    return ProcStat(pid, rest[0], int(rest[2]), int(rest[19]))


_BOOT_ID: str | None = None


def boot_id() -> str:
    global _BOOT_ID
    if _BOOT_ID is None:
        try:
            _BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            _BOOT_ID = "unknown"
    return _BOOT_ID


@dataclass(frozen=True)
class ChildRecord:
    """`child.json`: the child tree's leader (pid = process group id) and the agent that started it."""

    leader: ProcessId
    agent_id: str
    agent: ProcessId | None

    def write(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({
            "pid": self.leader.pid, "pgid": self.leader.pid, "start_ticks": self.leader.start_ticks,
            "boot_id": self.leader.boot_id, "agent_id": self.agent_id,
            "agent_pid": self.agent.pid if self.agent else None,
            "agent_start_ticks": self.agent.start_ticks if self.agent else None,
        }))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> ChildRecord | None:
        try:
            d = json.loads(path.read_text())
            leader = ProcessId(int(d["pid"]), int(d["start_ticks"]), str(d["boot_id"]))
            agent = None
            if d.get("agent_pid") is not None:
                agent = ProcessId(int(d["agent_pid"]), int(d["agent_start_ticks"]), leader.boot_id)
            return cls(leader, str(d["agent_id"]), agent)
        except (OSError, ValueError, KeyError, TypeError):
            return None


RECORD = "child.json"
"""The child record's file name in an attempt dir."""
LEGACY_PID_FILE = "child.pid"
"""What agents before issue 34 wrote: a bare process group id, which cannot be verified."""


def members(record: ChildRecord) -> list[int]:
    """Pids of the recorded tree still running: processes of its group that started no earlier
    than its leader, in the same boot. The kernel keeps a number in use as a pid while any process
    has it as its process group id, so: if a process holds the leader's pid with another start
    time, the number was free, our group is empty, and that group is someone else's (nothing is
    ours); otherwise (the leader, or nobody, holds the pid) the group's members are our tree."""
    lead = record.leader
    if lead.boot_id != boot_id():
        return []
    holder = proc_stat(lead.pid)
    if holder is not None and holder.start_ticks != lead.start_ticks:
        return []
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name))
        if stat is not None and stat.pgrp == lead.pid and stat.state != "Z" and stat.start_ticks >= lead.start_ticks:
            out.append(stat.pid)
    return out


def kill_verified(pid: int, pgrp: int, not_before: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to `pid` through a pidfd, after checking (with the pidfd open, so the pid cannot
    change hands) that it is still in group `pgrp` and started no earlier than `not_before`."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        stat = proc_stat(pid)
        if stat is None or stat.pgrp != pgrp or stat.start_ticks < not_before:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, OSError):
        return False
    finally:
        os.close(fd)


def reap_leftovers(workdir: Path, rounds: int = 5) -> list[int]:
    """Kill what earlier agent processes left running in `workdir` (module docstring) and delete
    their records; called when an agent starts, before it leases anything. Returns the process
    groups that still had processes. A record of an agent that is still running is left alone (two
    agents sharing a work dir each keep their own), and a legacy `child.pid` (a bare number) is
    deleted without killing anything: nothing says the group is still the one it named."""
    killed = []
    for legacy in sorted(workdir.glob(f"run-*/attempt-*/{LEGACY_PID_FILE}")):
        with contextlib.suppress(OSError):
            legacy.unlink()
    for path in sorted(workdir.glob(f"run-*/attempt-*/{RECORD}")):
        record = ChildRecord.read(path)
        if record is None:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if record.agent is not None and record.agent.alive():
            continue  # its agent is running: its child is its own business
        hit = False
        for _ in range(rounds):  # members may fork while we look: until none is left
            found = members(record)
            if not found:
                break
            for pid in found:
                hit |= kill_verified(pid, record.leader.pid, record.leader.start_ticks)
            time.sleep(0.05)
        if hit:
            killed.append(record.leader.pid)
        with contextlib.suppress(OSError):
            path.unlink()
    return killed


class Child:
    """A running process tree in its own process group, logging to `log_path`, recorded in
    `child.json` (`ChildRecord`) until it is gone."""

    def __init__(self, argv: list[str], workdir: Path, log_name: str = "child.log", agent_id: str = "unknown"):
        self.workdir = workdir
        self.log_path = workdir / log_name
        self.record_path = workdir / RECORD
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(  # argv list, shell=False: nothing is interpreted
            argv, cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env(), start_new_session=True, preexec_fn=set_parent_death_signal,
        )
        self.pgid = self.proc.pid  # a session leader's pid is its process group id
        self.returncode: int | None = None
        leader = ProcessId.of(self.proc.pid)  # not reaped yet: /proc/<pid> is there, zombie or not
        if leader is not None:
            ChildRecord(leader, agent_id, ProcessId.of(os.getpid())).write(self.record_path)

    def _exited(self) -> bool:
        """Whether the leader has exited, without reaping it (its pid, and so the group id, stays
        reserved until `_reap`)."""
        if self.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def _reap(self) -> int:
        """Kill the group's stragglers (the exited leader still holds the group id), reap the
        leader, delete the record."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)
            self.returncode = self.proc.wait()
            with contextlib.suppress(OSError):
                self.record_path.unlink()
        return self.returncode

    def poll(self) -> int | None:
        return self._reap() if self._exited() else None

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code once the leader exits within `timeout` seconds (stragglers killed), else None."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._exited():
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.02 if deadline is None else min(0.02, max(0.0, deadline - time.monotonic())))
        return self._reap()

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGTERM the whole group (torchrun forwards it to its workers), SIGKILL it after `grace_s`;
        the group is signalled only while its leader is unreaped, so the id is still ours."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if self._exited():
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
            deadline = time.monotonic() + wait
            while not self._exited() and time.monotonic() < deadline:
                time.sleep(0.02)
        return self._reap()

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
        code = child.wait(timeout_s)
        if code is None:
            child.stop(grace_s=2.0)
        return code
    finally:
        child.close()
