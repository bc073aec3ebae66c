"""`autopar profile`'s measurement (runtime.kernel_profile) on this CPU: a tiny plan's kernel
lookups timed into a valid atlas file labelled as the CPU, within its time budget; the command
line (`autopar profile`, `autopar plan --atlas`) writes it and prices with it, saying so."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner

from autopar.cli import app
from cluster_specs.presets import get_cluster
from cost_models.kernels.schema import read_atlas_file
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.finetune import search_finetune
from planner.kernel_profile import plan_needs
from planner.plan import Plan, SearchConstraints
from runtime.kernel_profile import profile, profile_plan

TINY = ["--model", "tiny", "--cluster", "local-cpu", "--gpus", "1", "--seq-len", "64", "--global-batch", "4"]


def tiny_plan() -> Plan:
    plan = search_finetune(get_model("tiny"), TrainingSpec(seq_len=64, global_batch=4), get_cluster("local-cpu"), 1,
                           SearchConstraints())
    assert plan.best is not None
    return plan


def test_a_tiny_plan_profiled_on_the_cpu_is_a_valid_atlas_of_every_lookup(tmp_path: Path) -> None:
    plan = tiny_plan()
    seen: list[tuple[int, int, str]] = []
    doc, skipped = profile_plan(plan, device=torch.device("cpu"), max_seconds=60.0,
                                progress=lambda i, n, label: seen.append((i, n, label)))
    (tmp_path / "a.json").write_text(json.dumps(doc))
    atlas = read_atlas_file(tmp_path / "a.json")
    assert atlas.gpu == "cpu" and atlas.provenance is not None
    assert atlas.provenance.device.startswith("cpu") and "torch" in atlas.provenance.software
    assert "the CPU" in atlas.description and skipped == []
    needs = plan_needs(plan)
    assert {(p.m, p.n, p.k, p.dtype) for p in atlas.gemm} == needs.gemm
    assert {(p.kernel, p.head_dim, p.seq_len, p.causal) for p in atlas.attention} == {
        k[:4] for k in needs.attention}
    assert {p.pass_ for p in atlas.attention} == {"fwd", "fwd_bwd"} and len(atlas.memory) == 1
    assert all(p.seconds and p.seconds > 0 for p in atlas.gemm)
    assert [i for i, _, _ in seen] == list(range(1, len(seen) + 1)) and seen[-1][0] == seen[-1][1]


def test_the_time_budget_skips_what_it_has_no_time_for() -> None:
    needs = plan_needs(tiny_plan())
    doc, skipped = profile(needs, "cpu", device=torch.device("cpu"), max_seconds=1e-9)
    measured = len(doc["gemm"]) + len(doc["attention"]) // 2 + len(doc["memory"])
    assert measured <= 1 and len(skipped) == len(needs.gemm) + len({k[:4] for k in needs.attention}) + 1 - measured
    assert all("over --max-seconds" in s for s in skipped)


def test_autopar_profile_then_plan_with_the_atlas(tmp_path: Path) -> None:
    runner = CliRunner()
    plan_file, atlas = tmp_path / "plan.json", tmp_path / "atlas.json"
    r = runner.invoke(app, ["plan", *TINY, "--json"])
    assert r.exit_code == 0, r.output
    plan_file.write_text(r.stdout)
    r = runner.invoke(app, ["profile", str(plan_file), "--out", str(atlas), "--max-seconds", "60"])
    assert r.exit_code == 0, r.output
    assert "[1/" in r.output and f"atlas -> {atlas}" in r.output
    assert read_atlas_file(atlas).gpu == "cpu"
    r = runner.invoke(app, ["plan", *TINY, "--json", "--atlas", str(atlas)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    note = out["kernel_profile"]
    assert note["from_profile"] == note["needed"] > 0 and note["device"].startswith("cpu")
    assert out["best"]["estimate"]["kernels"]["time_share"]["measured"] == 1.0
    assert any("this cluster's profile" in line for line in out["why"])
    # the same options instead of a plan file
    r = runner.invoke(app, ["profile", *TINY, "--out", str(tmp_path / "b.json"), "--max-seconds", "60"])
    assert r.exit_code == 0, r.output


def test_bad_profile_inputs_are_refused_by_name(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "autopar-kernel-atlas/1", "gpu": "cpu", "sources": {}}))
    r = runner.invoke(app, ["plan", *TINY, "--atlas", str(bad)])
    assert r.exit_code == 2 and "--atlas" in r.output and "sources" in r.output
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"format": "autopar-kernel-atlas/1", "gpu": "cpu",
                               "sources": {"p": {"citation": "this test's figure", "method": "queued"}},
                               "memory": [{"op": "copy", "gb_per_s": 5.0, "source": "p"}]}))
    r = runner.invoke(app, ["plan", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "1", "--seq-len", "64",
                            "--global-batch", "4", "--atlas", str(cpu)])
    assert r.exit_code == 2 and "--atlas: gpu: the kernel profile measured cpu, the cluster's GPU is H100-80GB" in r.output
    r = runner.invoke(app, ["profile", "--model", "tiny"])
    assert r.exit_code == 2 and "PLAN_FILE" in r.output
    plan_file = tmp_path / "p.json"
    plan_file.write_text(json.dumps({"inputs": {}}))
    r = runner.invoke(app, ["profile", str(plan_file)])
    assert r.exit_code == 2 and "PLAN_FILE: inputs" in r.output


def test_a_gemm_that_cannot_be_timed_in_the_budget_is_not_started() -> None:
    """The LM head of Llama-3 at 8,192 tokens is 8.6 TFLOP per call: on one CPU thread it is skipped,
    named, instead of overrunning --max-seconds."""
    from cost_models.kernels.record import Lookups

    needs = Lookups(gemm={(64, 64, 64, "bf16"), (8192, 128256, 4096, "bf16")})
    doc, skipped = profile(needs, "cpu", device=torch.device("cpu"), max_seconds=20.0)
    assert [(p["m"], p["n"], p["k"]) for p in doc["gemm"]] == [(64, 64, 64)]
    (why,) = skipped
    assert why.startswith("gemm 8192 128256 4096 bf16: about ") and "over the" in why
