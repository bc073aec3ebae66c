"""The agent's kernel-profile step (`autopar agent --profile-kernels`): before a new plan's first
run it measures the plan's kernels on its node (the real `runtime.kernel_profile`, on this CPU) and
stores them as its cluster's profile; a second run of the same plan is not profiled again; a
failed upload leaves the run to go on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.client import RetryPolicy
from agent.runner import Agent, AgentConfig
from cluster_specs.presets import get_cluster
from cost_models.kernels.schema import parse_atlas
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.finetune import search_finetune
from planner.plan import SearchConstraints

from .conftest import FakeServer


def tiny_plan() -> dict[str, Any]:
    plan = search_finetune(get_model("tiny"), TrainingSpec(seq_len=64, global_batch=4), get_cluster("local-cpu"), 2,
                           SearchConstraints())
    assert plan.best is not None
    return plan.model_dump(mode="json")


def lease(plan: dict[str, Any], run_id: int) -> dict[str, Any]:
    return {"run": {"id": run_id, "steps": 2, "lease_seconds": 30, "launch": {"nproc_per_node": 2, "backend": "gloo"}},
            "plan": plan, "attempt": 1, "lease_deadline": "2099-01-01T00:00:00+00:00"}


def make_agent(srv: FakeServer, workdir: Path) -> Agent:
    return Agent(AgentConfig(
        server=srv.url, token="apt_test", cluster="lab-cpu", workdir=workdir, once=True, heartbeat_s=0.3,
        stop_grace_s=2.0, retry=RetryPolicy(tries=2, max_elapsed_s=3.0, base_s=0.1, cap_s=0.2),
        report_retry=RetryPolicy(tries=2, max_elapsed_s=3.0, base_s=0.1, cap_s=0.2),
        profile_kernels=True, profile_max_seconds=60.0,
    ))


def test_the_plans_kernels_are_measured_and_stored_before_its_run(
    fake_server: FakeServer, fake_runtime: Path, tmp_path: Path,
) -> None:
    plan = tiny_plan()
    fake_server.queue.append(lease(plan, 21))
    agent = make_agent(fake_server, tmp_path / "w")
    assert agent.run_forever() == 0
    doc = parse_atlas(fake_server.atlases["lab-cpu"])
    assert doc.gpu == "cpu" and doc.provenance is not None and doc.provenance.device.startswith("cpu")
    assert doc.gemm and doc.memory
    paths = fake_server.paths()
    assert paths.index("/v1/clusters/lab-cpu/atlas") < paths.index("/v1/runs/21/profile")  # before training
    assert fake_server.bodies("/finish")[0]["status"] == "succeeded"
    adir = tmp_path / "w" / "run-21" / "attempt-1"
    assert json.loads((adir / "kernel-profile.json").read_text())["gpu"] == "cpu"
    assert "[1/" in (adir / "kernel-profile.log").read_text()  # progress lines
    # the same plan again: no second profile
    fake_server.queue.append(lease(plan, 22))
    assert agent.run_forever() == 0
    assert fake_server.paths("PUT").count("/v1/clusters/lab-cpu/atlas") == 1
    assert fake_server.bodies("/finish")[1]["status"] == "succeeded"


def test_a_refused_upload_leaves_the_run_to_go_on(fake_server: FakeServer, fake_runtime: Path, tmp_path: Path) -> None:
    fake_server.queue.append(lease(tiny_plan(), 23))
    agent = make_agent(fake_server, tmp_path / "w")
    agent.cfg.cluster = "unregistered"
    original = fake_server.handle

    def handle(method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        if path.endswith("/atlas"):
            return 404, {"detail": [{"loc": ["path", "name"], "msg": "no team cluster 'unregistered'"}]}
        return original(method, path, headers, body)

    fake_server.handle = handle  # type: ignore[method-assign]
    assert agent.run_forever() == 0
    assert fake_server.bodies("/finish")[0]["status"] == "succeeded"
    assert (tmp_path / "w" / "run-23" / "attempt-1" / "kernel_profile_http").read_text() == "404"
