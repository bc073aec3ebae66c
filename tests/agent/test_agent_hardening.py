"""Issue 34's agent findings: it kills only the processes it started (verified by start time, never
a process group named by a bare number after PIDs wrapped), deletes its child records, refuses a
lease whose plan is not a Plan or names a file outside its work dir, stops a run whose token was
revoked, and launches exactly the plan's process count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.launcher import ChildRecord, LaunchError, LaunchSpec, ProcessId, proc_stat, reap_leftovers
from agent.lease import files_outside

from .conftest import FakeServer
from .test_agent_units import alive, lease_answer, make_agent

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _session(argv: list[str]) -> subprocess.Popen[bytes]:
    """A process in a session (and process group) of its own, as an agent's child is."""
    return subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)


def _attempt(workdir: Path, run: int = 1) -> Path:
    adir = workdir / f"run-{run}" / "attempt-1"
    adir.mkdir(parents=True)
    return adir


def _dead_agent() -> ProcessId:
    """The identity of an agent process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = ProcessId.of(p.pid)
    p.wait()
    assert ident is not None
    return ident


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(10)


def test_a_leftover_tree_of_a_dead_agent_is_killed_and_its_record_deleted(tmp_path: Path) -> None:
    tree = _session([sys.executable, "-c",
                     "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
                     "time.sleep(120)"])
    try:
        time.sleep(0.5)
        grandchildren = [p for p in (proc_stat(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit())
                         if p is not None and p.pgrp == tree.pid and p.pid != tree.pid]
        assert grandchildren
        leader = ProcessId.of(tree.pid)
        assert leader is not None
        record = _attempt(tmp_path) / "child.json"
        ChildRecord(leader, "gone-agent", _dead_agent()).write(record)
        assert reap_leftovers(tmp_path) == [tree.pid]
        tree.wait(10)
        time.sleep(0.2)
        assert not any(alive(g.pid) for g in grandchildren)
        assert not record.exists()
    finally:
        _stop(tree)


def test_a_reused_pid_is_not_killed(tmp_path: Path) -> None:
    """Issue 34: after PIDs wrapped, an agent killed an unrelated process group named in an old
    `child.pid`. A record whose pid now belongs to a process started at another time (here: the
    record's start time is the unrelated process's minus one tick) is deleted, nothing killed; a
    legacy `child.pid` is deleted without killing."""
    stranger = _session(SLEEPER)
    try:
        time.sleep(0.2)
        now = ProcessId.of(stranger.pid)
        assert now is not None
        recycled = ProcessId(stranger.pid, now.start_ticks - 1, now.boot_id)  # the pid of an older process
        record = _attempt(tmp_path, 1) / "child.json"
        ChildRecord(recycled, "gone-agent", _dead_agent()).write(record)
        legacy = _attempt(tmp_path, 2) / "child.pid"
        legacy.write_text(str(stranger.pid))
        other_boot = _attempt(tmp_path, 3) / "child.json"
        ChildRecord(ProcessId(stranger.pid, now.start_ticks, "another-boot"), "gone-agent", None).write(other_boot)
        assert reap_leftovers(tmp_path) == []
        time.sleep(0.2)
        assert stranger.poll() is None and alive(stranger.pid)
        assert not record.exists() and not legacy.exists() and not other_boot.exists()
    finally:
        _stop(stranger)


def test_the_children_of_a_running_agent_are_left_alone(tmp_path: Path) -> None:
    """Two agents sharing a work dir: the one starting does not kill what the running one launched."""
    child = _session(SLEEPER)
    try:
        time.sleep(0.2)
        leader, me = ProcessId.of(child.pid), ProcessId.of(os.getpid())
        assert leader is not None and me is not None
        record = _attempt(tmp_path) / "child.json"
        ChildRecord(leader, "running-agent", me).write(record)
        assert reap_leftovers(tmp_path) == []
        assert child.poll() is None and record.exists()
    finally:
        _stop(child)


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        # a RunSpec instead of a Plan: the runtime would read the file and send values from it back
        ({"model": "tiny", "training": {"seq_len": 8, "global_batch": 2}, "gpus": 2, "layout": {},
          "data_path": "/etc/passwd"}, "plan.inputs"),
        ({"inputs": {"gpus": 2}, "best": {"layout": {}}, "data_path": "/etc/passwd"}, "plan.data_path"),
        ({"inputs": {"gpus": 2}, "best": {"layout": {}, "data_path": "../../../etc/passwd"}}, "plan.best.data_path"),
        ({"inputs": {"gpus": 2}, "best": {"layout": {}}, "checkpoint_dir": "/root"}, "plan.checkpoint_dir"),
    ],
)
def test_a_lease_naming_a_file_outside_the_work_dir_is_refused(
    plan: dict[str, Any], field: str, fake_server: FakeServer, tmp_path: Path
) -> None:
    answer = {**lease_answer(), "plan": plan}
    fake_server.queue.append(answer)
    agent = make_agent(fake_server, tmp_path / "w")
    assert agent.run_forever() == 0
    (finish,) = fake_server.bodies("/finish")
    assert finish["status"] == "failed" and "agent refused the leased run" in finish["log_tail"], finish
    assert field in finish["log_tail"], finish
    assert not (tmp_path / "w" / "run-11" / "attempt-1" / "child.log").exists()
    assert not fake_server.bodies("/profile") and not fake_server.bodies("/heartbeat")


def test_files_inside_the_attempt_dir_are_allowed(tmp_path: Path) -> None:
    adir = tmp_path / "run-1" / "attempt-1"
    assert files_outside({"inputs": {}, "best": {}, "data_path": "tokens.bin"}, adir) == []
    assert files_outside({"x": [{"data_path": str(adir / "d" / "t.bin")}]}, adir) == []
    assert files_outside({"x": [{"data_path": str(tmp_path / "t.bin")}]}, adir) == [
        f"plan.x.0.data_path: {str(tmp_path / 't.bin')!r} is outside the agent's work dir"
    ]


def test_a_revoked_token_stops_the_run_and_the_agent(
    fake_server: FakeServer, fake_runtime: Path, tmp_path: Path
) -> None:
    """Issue 34: the 401 heartbeats of a revoked token were only logged while the job ran on."""

    def heartbeat(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["progress"]["step"] >= 2:
            return 401, {"detail": [{"loc": ["header", "authorization"], "msg": "unknown or revoked token"}]}
        return 200, {"lease_deadline": "2099-01-01T00:00:00+00:00", "cancel_requested": False}

    fake_server.heartbeat_answer = heartbeat
    fake_server.queue.append(lease_answer(steps=200))
    agent = make_agent(fake_server, tmp_path / "w")
    agent.cfg.once = False  # it would poll on forever; the refused token ends it
    t0 = time.monotonic()
    assert agent.run_forever() == 1
    assert time.monotonic() - t0 < 30  # 200 steps x 0.3 s would take a minute
    adir = tmp_path / "w" / "run-11" / "attempt-1"
    time.sleep(0.2)
    assert not alive(int((adir / "grandchild.pid").read_text()))
    assert json.loads((adir / "outcome.json").read_text())["outcome"] == "token_refused"
    assert not (adir / "child.json").exists()
    assert not fake_server.bodies("/profile") and not fake_server.bodies("/finish")
    assert fake_server.paths("POST").count("/v1/runs/lease") == 1  # no lease after the refusal


@pytest.mark.parametrize("nproc", [1, 12])
def test_the_process_count_is_the_plans(nproc: int) -> None:
    """Issue 34: the agent started 12 workers for a 2-GPU plan."""
    with pytest.raises(LaunchError, match="is not the plan's 2 GPUs"):
        LaunchSpec.from_run({"steps": 3, "launch": {"nproc_per_node": nproc}}, {"inputs": {"gpus": 2}})
    assert LaunchSpec.from_run({"steps": 3, "launch": {}}, {"inputs": {"gpus": 2}}).nproc_per_node == 2
