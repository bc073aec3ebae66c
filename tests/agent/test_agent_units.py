"""The agent alone: retries through a server that comes up late, launch validation, process-tree
stop, and one attempt's life (heartbeats with progress, idempotent upload, cancel, lost lease)
against a stdlib contract server. Children are real processes; a stand-in for the runtime (a
Python child that forks a grandchild and writes progress) keeps these fast; the real runtime runs
in test_runtime_progress_file and the end-to-end test."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent import runner as runner_mod
from agent.client import ApiClient, RetryPolicy, ServerUnavailable
from agent.launcher import Child, LaunchError, LaunchSpec, log_tail, read_progress, runtime_argv
from agent.runner import Agent, AgentConfig

from .conftest import FAKE_RUNTIME, FakeServer, free_port

ROOT = Path(__file__).resolve().parents[2]

def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def lease_answer(run_id: int = 11, attempt: int = 1, steps: int = 6, **launch: Any) -> dict[str, Any]:
    return {
        "run": {"id": run_id, "steps": steps, "lease_seconds": 3, "launch": {"nproc_per_node": 2, "backend": "gloo", **launch}},
        "plan": {"inputs": {"gpus": 2, "model": {"name": "$(touch /tmp/autopar-pwned-unit)"}}, "best": {"layout": {}}},
        "attempt": attempt,
        "lease_deadline": "2099-01-01T00:00:00+00:00",
    }


def make_agent(srv: FakeServer, workdir: Path) -> Agent:
    cfg = AgentConfig(
        server=srv.url, token="apt_test", cluster="local-cpu", workdir=workdir, once=True, heartbeat_s=0.3,
        stop_grace_s=2.0, retry=RetryPolicy(tries=3, max_elapsed_s=5.0, base_s=0.1, cap_s=0.5),
    )
    return Agent(cfg)


# ---- client -------------------------------------------------------------------------------------


def test_backoff_is_exponential_capped_and_jittered() -> None:
    p = RetryPolicy(base_s=0.5, cap_s=8.0)
    rng = random.Random(1)
    for k, d in enumerate([0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]):
        draws = [p.delay(k, rng) for _ in range(200)]
        assert d / 2 <= min(draws) and max(draws) <= d
        assert max(draws) - min(draws) > 0.3 * d / 2  # really jittered


def test_client_waits_for_a_server_that_comes_up_late(tmp_path: Path) -> None:
    srv = FakeServer(free_port())
    srv.reserve()  # refuses connections until it starts, and keeps the port from other tests meanwhile
    client = ApiClient(srv.url, "apt_x", retry=RetryPolicy(tries=10, max_elapsed_s=20.0, base_s=0.2, cap_s=1.0))
    t0 = time.monotonic()
    starter = threading.Timer(1.5, srv.start)
    starter.start()
    try:
        info = client.register("a", "local-cpu", "host")
        assert info["id"] == 7 and time.monotonic() - t0 >= 1.5  # answered only once the server was up
        assert srv.calls[0][2]["authorization"] == "Bearer apt_x"
    finally:
        client.close()
        starter.join()
        srv.stop()


def test_client_gives_up_within_its_budget() -> None:
    client = ApiClient(f"http://127.0.0.1:{free_port()}", "t", retry=RetryPolicy(tries=50, max_elapsed_s=1.0, base_s=0.2))
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable):
        client.lease(1)
    assert time.monotonic() - t0 < 3.0
    client.close()


# ---- launch ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run",
    [
        {"steps": 3, "launch": {"backend": "gloo; touch /tmp/autopar-pwned-unit"}},
        {"steps": 3, "launch": {"nproc_per_node": "2 && touch /tmp/autopar-pwned-unit"}},
        {"steps": "3; touch /tmp/autopar-pwned-unit", "launch": {}},
        {"steps": True, "launch": {}},
        {"steps": 3, "launch": {"nproc_per_node": 0}},
    ],
)
def test_launch_spec_refuses_anything_but_typed_values(run: dict[str, Any]) -> None:
    with pytest.raises(LaunchError):
        LaunchSpec.from_run(run, {"inputs": {"gpus": 2}})


def test_launch_argv_is_the_autopar_run_line() -> None:
    spec = LaunchSpec.from_run({"steps": 4, "launch": {"nproc_per_node": None, "backend": "gloo"}}, {"inputs": {"gpus": 2}})
    argv = runtime_argv(spec, Path("/w/plan.json"), Path("/w/profile.json"), Path("/w/progress.json"))
    assert argv[1:] == [
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "runtime.launch", "/w/plan.json",
        "--steps", "4", "--out", "/w/profile.json", "--backend", "gloo", "--progress-file", "/w/progress.json",
    ]


def test_stop_kills_the_whole_process_tree(tmp_path: Path) -> None:
    script = tmp_path / "tree.py"
    script.write_text(FAKE_RUNTIME)
    child = Child([sys.executable, str(script), "100", "0.2"], tmp_path)
    deadline = time.monotonic() + 10
    while not (tmp_path / "grandchild.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    record = json.loads((tmp_path / "child.json").read_text())
    assert alive(grandchild) and record["pgid"] == record["pid"] == child.pgid
    assert record["agent_pid"] == os.getpid() and record["start_ticks"] > 0
    child.stop(grace_s=1.0)
    child.close()
    time.sleep(0.2)
    assert not alive(child.proc.pid) and not alive(grandchild)
    assert not (tmp_path / "child.json").exists()  # the record goes with the tree


def test_log_tail_is_bounded_utf8(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(("é" * 50_000).encode() + b"\xff\xfe end")
    tail = log_tail(log, 1000)
    assert len(tail.encode()) <= 1000 and tail.endswith(" end")


# ---- one attempt against the contract server --------------------------------------------------------


def test_attempt_reports_progress_uploads_once_and_finishes(fake_server: FakeServer, fake_runtime: Path, tmp_path: Path) -> None:
    fake_server.queue.append(lease_answer(steps=6))
    agent = make_agent(fake_server, tmp_path / "w")
    assert agent.run_forever() == 0
    beats = fake_server.bodies("/heartbeat")
    steps_seen = [b["progress"]["step"] for b in beats]
    assert steps_seen[0] == 0 and max(steps_seen) >= 3  # progress from the child's progress file
    assert all(b["attempt"] == 1 and b["agent_id"] == 7 for b in beats)
    (profile,) = fake_server.bodies("/profile")
    assert profile["mfu"] is None  # NaN is not JSON: sent as null
    (put_query,) = [h["x-query"] for m, p, h, _ in fake_server.calls if p.endswith("/profile")]
    assert put_query == "agent_id=7&attempt=1"  # the lease holder names itself and its attempt
    finish = fake_server.bodies("/finish")[0]
    assert finish["status"] == "succeeded" and finish["exit_code"] == 0 and "step 6" in finish["log_tail"]
    adir = tmp_path / "w" / "run-11" / "attempt-1"
    key = (adir / "idempotency_key").read_text()
    put_headers = [h for m, p, h, _ in fake_server.calls if m == "PUT"][0]
    assert put_headers["idempotency-key"] == key
    # the plan is data in a file: its "$(...)" model name was never run
    assert "$(touch" in (adir / "plan.json").read_text()
    assert not Path("/tmp/autopar-pwned-unit").exists()
    # a retried upload of the same attempt reuses the key: the server answers 200, no second profile
    again = agent.client.put_profile("11", agent.agent_id, 1, profile, runner_mod.idempotency_key(adir, fake_server.url, "11", 1))
    assert again == fake_server.profiles["11"] and len(fake_server.profiles) == 1
    assert [h["idempotency-key"] for m, p, h, _ in fake_server.calls if m == "PUT"] == [key, key]


@pytest.mark.parametrize("answer", ["cancel", "lease_lost"])
def test_cancel_or_lost_lease_stops_the_child_tree(answer: str, fake_server: FakeServer, fake_runtime: Path, tmp_path: Path) -> None:
    def heartbeat(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["progress"]["step"] >= 2:
            if answer == "cancel":
                return 200, {"lease_deadline": "2099-01-01T00:00:00+00:00", "cancel_requested": True}
            return 409, {"detail": "lease held by another attempt"}
        return 200, {"lease_deadline": "2099-01-01T00:00:00+00:00", "cancel_requested": False}

    fake_server.heartbeat_answer = heartbeat
    fake_server.queue.append(lease_answer(steps=200))
    agent = make_agent(fake_server, tmp_path / "w")
    t0 = time.monotonic()
    assert agent.run_forever() == 0
    assert time.monotonic() - t0 < 20  # 200 steps x 0.3 s would take a minute
    adir = tmp_path / "w" / "run-11" / "attempt-1"
    grandchild = int((adir / "grandchild.pid").read_text())
    time.sleep(0.2)
    assert not alive(grandchild)
    assert read_progress(adir / "progress.json")["step"] < 200  # type: ignore[index]
    assert not fake_server.bodies("/profile")
    outcome = json.loads((adir / "outcome.json").read_text())
    if answer == "cancel":
        assert fake_server.bodies("/finish")[0]["status"] == "cancelled" and outcome["outcome"] == "cancelled"
    else:
        assert not fake_server.bodies("/finish") and outcome["outcome"] == "lease_lost"


def test_refused_launch_is_reported_failed_without_running(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.queue.append(lease_answer(backend="gloo; touch /tmp/autopar-pwned-unit"))
    agent = make_agent(fake_server, tmp_path / "w")
    assert agent.run_forever() == 0
    finish = fake_server.bodies("/finish")[0]
    assert finish["status"] == "failed" and "launch.backend" in finish["log_tail"]
    assert not (tmp_path / "w" / "run-11" / "attempt-1" / "child.log").exists()
    assert not Path("/tmp/autopar-pwned-unit").exists()


def _malformed(**changes: Any) -> dict[str, Any]:
    """lease_answer() with the run's fields replaced (a value of DROP removes the key)."""
    answer = lease_answer()
    for key, value in changes.items():
        target = answer["run"] if key in answer["run"] or key in ("id", "steps", "lease_seconds", "launch") else answer
        if value is DROP:
            target.pop(key, None)
        else:
            target[key] = value
    return answer


DROP = object()


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        (_malformed(steps=True), "run.steps"),
        (_malformed(steps="3; touch /tmp/autopar-pwned-unit"), "run.steps"),
        (_malformed(steps=DROP), "run.steps"),
        (_malformed(lease_seconds="soon"), "run.lease_seconds"),
        (_malformed(launch=["--", "sh", "-c", "touch /tmp/autopar-pwned-unit"]), "run.launch"),
        (_malformed(launch={"nproc_per_node": 2.5}), "run.launch.nproc_per_node"),
        (_malformed(plan="not a plan"), "plan"),
        (_malformed(plan=DROP), "plan"),
    ],
)
def test_malformed_lease_is_finished_failed_with_the_reason(
    answer: dict[str, Any], field: str, fake_server: FakeServer, tmp_path: Path
) -> None:
    """The answer still names its run and attempt: the agent refuses to act on it and finishes that
    attempt as failed, saying which field was wrong (issue 12, finding 8)."""
    fake_server.queue.append(answer)
    agent = make_agent(fake_server, tmp_path / "w")
    assert agent.run_forever() == 0
    (finish,) = fake_server.bodies("/finish")
    assert finish["status"] == "failed" and finish["attempt"] == 1, finish
    assert "agent refused the leased run" in finish["log_tail"] and f"{field}:" in finish["log_tail"], finish
    assert fake_server.paths("POST")[-1] == "/v1/runs/11/finish" and not fake_server.bodies("/heartbeat")
    assert not (tmp_path / "w" / "run-11" / "attempt-1" / "child.log").exists()
    assert not Path("/tmp/autopar-pwned-unit").exists()


@pytest.mark.parametrize(
    "answer",
    [
        [],
        "run 11",
        {"plan": {}, "attempt": 1},
        {**lease_answer(), "run": "11"},
        {**lease_answer(), "attempt": True},
        {**lease_answer(), "attempt": "1"},
        _malformed(id="../../etc"),
        _malformed(id=None),
    ],
)
def test_lease_naming_no_valid_run_is_refused_without_crashing(answer: Any, fake_server: FakeServer, tmp_path: Path) -> None:
    """Nothing to report to: the agent logs it, launches nothing, writes nothing outside its work dir
    and goes on polling (the server's lease expires and re-queues the run)."""
    fake_server.queue.append(answer)
    agent = make_agent(fake_server, tmp_path / "w")
    assert agent.execute(answer) == "refused"
    fake_server.queue.append(answer)
    assert agent.run_forever() == 0  # --once: polled, refused, done; no exception
    assert not fake_server.bodies("/finish") and not fake_server.bodies("/heartbeat")
    assert not list((tmp_path / "w").glob("run-*")) and not (tmp_path / "etc").exists()


def test_the_agent_token_never_reaches_the_training_processes(
    fake_server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token stays in the agent: not in the children's argv (visible in `ps`) nor environment."""
    token = "apt_never-in-a-child-0123456789"
    monkeypatch.setenv("AUTOPAR_AGENT_TOKEN", token)
    script = tmp_path / "dump.py"
    script.write_text(
        "import json, os, sys\n"
        "json.dump({'argv': open('/proc/self/cmdline', 'rb').read().decode(errors='replace'), "
        "'env': dict(os.environ)}, open('seen.json', 'w'))\n"
    )
    real_argv = runner_mod.runtime_argv
    planned: list[list[str]] = []

    def spy(*args: Any) -> list[str]:  # the argv the agent would launch, then a script that dumps its view
        planned.append(real_argv(*args))
        return [sys.executable, str(script)]

    monkeypatch.setattr(runner_mod, "runtime_argv", spy)
    fake_server.queue.append(lease_answer(steps=1))
    agent = make_agent(fake_server, tmp_path / "w")
    agent.cfg.token = token
    agent.run_forever()
    assert planned and not any(token in arg for arg in planned[0])
    seen = (tmp_path / "w" / "run-11" / "attempt-1" / "seen.json").read_text()
    assert "AUTOPAR_AGENT_TOKEN" not in json.loads(seen)["env"] and token not in seen


def test_agent_token_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`autopar agent` never needs the token on its command line; given there, it warns."""
    import typer

    from autopar.cli_secrets import agent_token

    monkeypatch.delenv("AUTOPAR_AGENT_TOKEN", raising=False)
    with pytest.raises(typer.BadParameter, match="AUTOPAR_AGENT_TOKEN or give --token-file"):
        agent_token(None, None)
    monkeypatch.setenv("AUTOPAR_AGENT_TOKEN", "apt_from-env")
    assert agent_token(None, None) == "apt_from-env"
    token_file = tmp_path / "token"
    token_file.write_text("apt_from-file\n")
    token_file.chmod(0o600)
    assert agent_token(None, token_file) == "apt_from-file"
    assert capsys.readouterr().err == ""
    assert agent_token("apt_on-argv", None) == "apt_on-argv"
    assert "where `ps` shows it" in capsys.readouterr().err
    with pytest.raises(typer.BadParameter, match="not both"):
        agent_token("apt_on-argv", token_file)
    token_file.write_text("")
    with pytest.raises(typer.BadParameter, match="empty"):
        agent_token(None, token_file)
    import subprocess

    helped = subprocess.run([sys.executable, "-m", "autopar.cli", "agent", "--help"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert "--token-file" in helped.stdout, helped.stdout + helped.stderr


# ---- the real runtime ------------------------------------------------------------------------------


@pytest.mark.slow
def test_runtime_progress_file_with_torchrun(tmp_path: Path) -> None:
    """The real launch line on the tiny plan: progress file after every step, a Profile at the end."""
    import subprocess

    plan = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "2",
         "--seq-len", "64", "--global-batch", "4", "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout
    (tmp_path / "plan.json").write_text(plan)
    spec = LaunchSpec.from_run({"steps": 3, "launch": {"backend": "gloo"}}, json.loads(plan))
    argv = runtime_argv(spec, tmp_path / "plan.json", tmp_path / "profile.json", tmp_path / "progress.json")
    child = Child(argv, tmp_path)
    code = child.wait(240)
    child.close()
    assert code == 0, child.log_tail()
    assert read_progress(tmp_path / "progress.json") == {"step": 3, "steps": 3, "loss": pytest.approx(
        json.loads((tmp_path / "profile.json").read_text())["losses"][-1])}


@pytest.mark.slow
def test_preflight_all_reduce_bus_bandwidth(tmp_path: Path) -> None:
    """The pre-flight under torchrun (2 gloo ranks): NCCL-convention bus bandwidth of a 1 MiB all-reduce."""
    from agent.launcher import preflight_argv, run_to_completion

    spec = LaunchSpec.from_run({"steps": 1, "launch": {"nproc_per_node": 2, "backend": "gloo"}}, {"inputs": {"gpus": 2}})
    out = tmp_path / "preflight.json"
    assert run_to_completion(preflight_argv(spec, out, 2**20, 5), tmp_path, "preflight.log", 120) == 0
    r = json.loads(out.read_text())
    assert (r["collective"], r["bytes"], r["ranks"], r["backend"]) == ("all_reduce", 2**20, 2, "gloo")
    assert r["time_s"] > 0
    assert r["bus_bandwidth_bytes_per_s"] == pytest.approx(2 * (2 - 1) / 2 * 2**20 / r["time_s"], rel=1e-9)
