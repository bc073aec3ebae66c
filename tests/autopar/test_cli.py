"""The console script, driven as a user would (typer's runner, real subcommands)."""

import json

from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()


def test_evaluate_json() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--seq-len", "4096", "--global-batch", "16", "--tp", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"] is True


def test_evaluate_prices_eager_kernels_slower_and_refuses_an_unknown_one() -> None:
    args = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16", "--framework", "fsdp", "--zero", "3", "--json"]
    fused = json.loads(runner.invoke(app, args).stdout)
    eager = json.loads(runner.invoke(app, [*args, "--elementwise-kernels", "eager"]).stdout)
    assert eager["layout"]["elementwise_kernels"] == "eager"
    assert eager["step_s"] > fused["step_s"]
    r = runner.invoke(app, [*args, "--elementwise-kernels", "compiled"])
    assert r.exit_code != 0 and "elementwise_kernels" in r.stdout + r.output


def test_fsdp1_prices_no_per_layer_copies_and_is_fsdp_only() -> None:
    """--fsdp1: FSDP1's flat parameters skip FSDP2's copy-out of the gathered weights, so the same ZeRO-3 layout
    prices faster; a plan carries the stack to every layout; another framework is refused."""
    args = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16", "--framework", "fsdp", "--zero", "3", "--json"]
    fsdp2 = json.loads(runner.invoke(app, args).stdout)
    fsdp1 = json.loads(runner.invoke(app, [*args, "--fsdp1"]).stdout)
    assert fsdp1["layout"]["fsdp_flat_params"] and not fsdp2["layout"]["fsdp_flat_params"]
    assert fsdp1["step_s"] < fsdp2["step_s"]
    plan = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16", "--top", "2", "--json"]
    r = runner.invoke(app, [*plan, "--framework", "fsdp", "--fsdp1"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["best"]["layout"]["fsdp_flat_params"]
    r = runner.invoke(app, [*plan, "--fsdp1"])
    assert r.exit_code == 2 and "fsdp_flat_params" in r.output


def test_megatron_fsdp_without_gradient_fusion_prices_a_copy_and_is_megatron_only() -> None:
    """--no-megatron-fsdp-gradient-fusion (NeMo 2.3 / 2.4): Megatron FSDP copies every weight gradient per
    micro-batch, so the same ZeRO-3 layout prices slower and the distributed optimizer's the same; a plan
    carries the stack to every layout; another framework is refused."""
    base = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16", "--json"]
    off = "--no-megatron-fsdp-gradient-fusion"
    for zero, slower in (("3", True), ("1", False)):
        fused = json.loads(runner.invoke(app, [*base, "--zero", zero]).stdout)
        unfused = json.loads(runner.invoke(app, [*base, "--zero", zero, off]).stdout)
        assert not unfused["layout"]["megatron_fsdp_gradient_fusion"] and fused["layout"]["megatron_fsdp_gradient_fusion"]
        assert (unfused["step_s"] > fused["step_s"]) == slower
        assert unfused["step_s"] >= fused["step_s"]
    plan = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16", "--top", "2", "--json"]
    r = runner.invoke(app, [*plan, off])
    assert r.exit_code == 0, r.output
    assert not json.loads(r.stdout)["best"]["layout"]["megatron_fsdp_gradient_fusion"]
    r = runner.invoke(app, [*plan, "--framework", "fsdp", off])
    assert r.exit_code == 2 and "megatron_fsdp_gradient_fusion" in r.output


def test_attention_kernel_flash2_prices_hopper_attention_slower_and_a_plan_carries_it() -> None:
    """--attention-kernel: FlashAttention-2 on an H100 (its mma.sync kernels miss the wgmma peak) prices the
    same layout slower than the fused kernel; the framework's default holds when the flag is absent (fsdp
    runs SDPA's flash backend, Megatron Transformer Engine's fused attention); a plan prices every layout
    with the stack's kernel; an unknown kernel is refused."""
    args = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "16384",
            "--global-batch", "8", "--framework", "fsdp", "--zero", "3", "--json"]
    default = json.loads(runner.invoke(app, args).stdout)
    flash2 = json.loads(runner.invoke(app, [*args, "--attention-kernel", "flash2"]).stdout)
    fused = json.loads(runner.invoke(app, [*args, "--attention-kernel", "fused"]).stdout)
    assert default["step_s"] == flash2["step_s"] > fused["step_s"]
    assert flash2["layout"]["attention_kernel"] == "flash2" and default["layout"]["attention_kernel"] is None
    plan = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "16384",
            "--global-batch", "8", "--top", "2", "--json"]
    r = runner.invoke(app, [*plan, "--attention-kernel", "flash2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["best"]["layout"]["attention_kernel"] == "flash2"  # megatron's default is fused
    r = runner.invoke(app, [*args, "--attention-kernel", "flash4"])
    assert r.exit_code != 0 and "attention_kernel" in r.stdout + r.output


def test_evaluate_readable_breakdown() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--seq-len", "4096", "--global-batch", "16", "--tp", "2"])
    assert r.exit_code == 0, r.output
    assert "GiB" in r.stdout and "tokens/s/GPU" in r.stdout


def test_evaluate_partition_auto_and_recompute_modules() -> None:
    args = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "8192",
            "--global-batch", "32", "--tp", "2", "--pp", "2", "--vpp", "3", "--recompute", "selective",
            "--recompute-modules", "core_attn,layernorm"]
    r = runner.invoke(app, [*args, "--partition", "auto"])
    assert r.exit_code == 0, r.output
    assert "auto: partition" in r.stdout and "(cp-sat)" in r.stdout  # 32 layers do not divide 6 chunks
    out = json.loads(runner.invoke(app, [*args, "--partition", "6,6,5,5,5,5", "--json"]).stdout)
    assert out["ok"] and out["layout"]["recompute_modules"] == ["core_attn", "layernorm"]
    bad = runner.invoke(app, [*args, "--partition", "6,6,x"])
    assert bad.exit_code == 2 and "neither auto nor comma-separated" in bad.output


def test_evaluate_invalid_exits_nonzero_with_reason() -> None:
    r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                            "--global-batch", "16", "--tp", "3", "--json"])
    assert r.exit_code == 2
    assert "tp x pp x cp = 3 does not divide the 8 GPUs" in json.loads(r.stdout)["error"]


def test_jobs_keeps_order_and_survives_bad_lines(tmp_path) -> None:
    good = {"model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8}}
    lines = [json.dumps(good), "{not json", json.dumps({**good, "gpus": -1}), json.dumps(good)]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["evaluate", "--jobs", str(path)])
    assert r.exit_code == 0, r.output
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o["ok"] for o in out] == [True, False, False, True]
    assert "line 2: invalid JSON" in out[1]["error"]
    assert out[2]["error"].startswith("gpus:")


def test_jobs_with_several_workers_match_one_worker_line_for_line(tmp_path) -> None:
    good = {"model": "tiny", "cluster": "local-cpu", "training": {"seq_len": 128, "global_batch": 8}}
    lines = []
    for i in range(300):  # more lines than one pool chunk, valid and invalid mixed
        lines.append(json.dumps({**good, "gpus": [1, 2, 4, 8, 3][i % 5], "layout": {"tp": [1, 2][i % 2]}}))
        if i % 37 == 0:
            lines.append("{broken")
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    one = runner.invoke(app, ["evaluate", "--jobs", str(path), "--workers", "1"])
    two = runner.invoke(app, ["evaluate", "--jobs", str(path), "--workers", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, (one.output, two.output)
    assert two.stdout == one.stdout
    out = [json.loads(x) for x in one.stdout.splitlines()]
    assert len(out) == len(lines) and any(o["ok"] for o in out) and any(not o["ok"] for o in out)


def test_plan_json_and_impossible_job() -> None:
    r = runner.invoke(app, ["plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "4",
                            "--seq-len", "128", "--global-batch", "8", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    lay = plan["best"]["layout"]
    assert plan["schema_version"] == 1 and lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == 4
    r = runner.invoke(app, ["plan", "--model", "llama3-405b", "--cluster", "rtx4090-pcie-8", "--gpus", "8",
                            "--seq-len", "4096", "--global-batch", "64"])
    assert r.exit_code == 3
    assert "No layout fits" in r.stdout and "bytes" in r.stdout


def test_plan_with_eager_kernels_says_so_and_exports_without_compile() -> None:
    """--elementwise-kernels eager: the header names the kernels priced, every layout carries them,
    an unknown value is refused with the field, and the torchtitan export leaves compile off."""
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16", "--framework", "fsdp", "--elementwise-kernels", "eager"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "eager kernels" in r.stdout
    r = runner.invoke(app, [*args, "--json"])
    assert json.loads(r.stdout)["best"]["layout"]["elementwise_kernels"] == "eager"
    r = runner.invoke(app, [*args, "--export", "torchtitan"])
    assert r.exit_code == 0, r.output
    assert "[compile]" in r.stdout and "enable = false" in r.stdout.split("[compile]")[1].split("[")[0]
    r = runner.invoke(app, [*args[:-1], "compiled"])
    assert r.exit_code == 2 and "--elementwise-kernels: Input should be" in r.output


def test_plan_without_combined_1f1b_for_an_older_megatron_core() -> None:
    """--no-moe-a2a-overlap: gpt-oss-120b's plan on 64 H100 uses combined 1F1B by default; without it
    (a Megatron-Core from before August 2025) no candidate does, and the best is slower. (DeepSeek-V3's
    MTP module keeps combined 1F1B to pipelined layouts, tests/planner/test_combined_1f1b_mtp.py.)"""
    args = ["plan", "--model", "gpt-oss-120b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "4096",
            "--global-batch", "512", "--top", "3", "--json"]
    default = json.loads(runner.invoke(app, args).stdout)
    older = json.loads(runner.invoke(app, [*args, "--no-moe-a2a-overlap"]).stdout)
    assert default["best"]["layout"]["moe_a2a_overlap"]
    assert older["inputs"]["constraints"]["allow_moe_a2a_overlap"] is False
    assert not any(c["layout"]["moe_a2a_overlap"] for c in [older["best"], *older["alternatives"]])
    assert older["best"]["estimate"]["step_s"] > default["best"]["estimate"]["step_s"]


def test_plan_and_estimate_with_an_expert_grid_before_moe_parallel_folding() -> None:
    """--no-moe-folding (Megatron-Core 0.9): every candidate of the plan, and the priced layout of
    `evaluate`, carries the older expert grid: EP inside DP, expert TP = TP."""
    args = ["plan", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192",
            "--global-batch", "128", "--top", "3", "--json", "--no-moe-folding"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["inputs"]["constraints"]["moe_parallel_folding"] is False
    for c in [plan["best"], *plan["alternatives"]]:
        lay = c["layout"]
        assert lay["moe_parallel_folding"] is False and lay["etp"] in (None, lay["tp"]) and lay["dp"] % lay["ep"] == 0
    est = ["evaluate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "8192",
           "--global-batch", "128", "--tp", "2", "--cp", "2", "--ep", "8", "--json"]
    folded = json.loads(runner.invoke(app, est).stdout)
    older = json.loads(runner.invoke(app, [*est, "--no-moe-folding"]).stdout)
    assert older["layout"]["moe_parallel_folding"] is False and folded["layout"]["moe_parallel_folding"] is True
    # EP strided over TP x CP = 4 ranks spans twice the nodes of EP strided over TP = 2
    assert older["time"]["breakdown"]["ep_comm_s"] > folded["time"]["breakdown"]["ep_comm_s"]


def test_plan_within_the_zero_stages_of_an_older_megatron_core() -> None:
    """--max-zero 1 (a Megatron-Core without FSDP): no candidate shards beyond the distributed
    optimizer; a higher --zero pin than that is refused with the field named."""
    args = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "64", "--top", "5", "--json", "--max-zero", "1"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["inputs"]["constraints"]["max_zero_stage"] == 1
    assert all(c["layout"]["zero_stage"] <= 1 for c in [plan["best"], *plan["alternatives"]])
    r = runner.invoke(app, [*args, "--zero", "3"])
    assert r.exit_code == 2 and "max_zero_stage" in r.output


def test_plan_marks_an_mfu_above_every_published_run() -> None:
    """The MFU cell carries "!" and a line under the table names the ceiling exactly when the JSON's
    predicted MFU is above the highest any published run of its regime measured."""
    args = ["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--gpus", "1024", "--seq-len", "2048",
            "--global-batch", "1536", "--top", "1"]
    best = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["best"]["estimate"]
    above = best["mfu"] > best["published_mfu_ceiling"]["mfu"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert (f"{100 * best['mfu']:.1f}%" in r.stdout) and ("! above" in r.stdout) == above
    assert ("most any published run in regime dense|ampere|>150B" in " ".join(r.stdout.split())) == above


def test_plan_export_megatron() -> None:
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                            "--seq-len", "4096", "--global-batch", "64", "--export", "megatron"])
    assert r.exit_code == 0, r.output
    assert "--tensor-model-parallel-size" in r.stdout


def test_run_dry_run_prints_a_torchrun_line(tmp_path) -> None:
    r = runner.invoke(app, ["plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "4",
                            "--seq-len", "128", "--global-batch", "8", "--json"])
    plan = tmp_path / "plan.json"
    plan.write_text(r.stdout)
    r = runner.invoke(app, ["run", str(plan), "--dry-run", "--steps", "2"])
    assert r.exit_code == 0, r.output
    line = r.stdout.strip()
    assert "torch.distributed.run --standalone --nproc-per-node=4" in line
    assert line.endswith("--backend auto") and "-m runtime.launch" in line
    r = runner.invoke(app, ["run", str(plan), "--dry-run", "--data", str(tmp_path / "tokens.bin")])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"--data {tmp_path / 'tokens.bin'} --data-dtype uint16")
    r = runner.invoke(app, ["run", str(plan), "--dry-run", "--hf-checkpoint", str(tmp_path / "llama")])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"--hf-checkpoint {tmp_path / 'llama'}")


# ---- a CLI without dead ends ---------------------------------------------------------------------
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

from cluster_specs.presets import cluster_from_dict, get_cluster, list_clusters  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--cluster", "local-cpu", "--gpus", "4", "--seq-len", "128", "--global-batch", "8"]


def _no_traceback(r) -> None:  # type: ignore[no-untyped-def]
    assert "Traceback" not in r.output and "ModuleNotFoundError" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


@pytest.mark.parametrize(
    ("argv", "module", "extra"),
    [
        (["serve"], "uvicorn", "api"),
        (["tokens", "create", "--name", "x"], "sqlalchemy", "api"),
        (["tokens", "list"], "alembic", "api"),
        (["agent", "--server", "http://127.0.0.1:9", "--token", "t", "--cluster", "c"], "httpx", "api"),
        (["agent", "--server", "http://127.0.0.1:9", "--token", "t", "--cluster", "c"], "torch", "runtime"),
        (["run", "PLAN", "--steps", "1"], "torch", "runtime"),
        (["run", "PLAN", "--fake-world", "8"], "torch", "runtime"),
        (["profile", "PLAN"], "torch", "runtime"),
    ],
)
def test_missing_extra_names_the_extra_to_install(argv, module, extra, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A base install (`pip install -e .`) lacks the extras: simulated by hiding the module."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"inputs": {"gpus": 4}, "best": None}))
    monkeypatch.setitem(sys.modules, module, None)
    r = runner.invoke(app, [str(plan) if a == "PLAN" else a for a in argv])
    assert r.exit_code == 1, r.output
    assert f"install autopar[{extra}]" in r.output and f"missing: {module}" in r.output
    _no_traceback(r)


def test_run_dry_run_needs_no_runtime(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"inputs": {"gpus": 2}, "best": None}))
    monkeypatch.setitem(sys.modules, "torch", None)
    r = runner.invoke(app, ["run", str(plan), "--dry-run"])
    assert r.exit_code == 0 and "--nproc-per-node=2" in r.stdout


@pytest.mark.parametrize("name", list_clusters())
def test_clusters_show_prints_yaml_that_loads_back_to_the_preset(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autopar.cli_support import read_cluster_file

    r = runner.invoke(app, ["clusters", "--show", name])
    assert r.exit_code == 0, r.output
    path = tmp_path / "copy.yaml"
    path.write_text(r.stdout)
    assert yaml.safe_load(r.stdout)["name"] == name
    assert cluster_from_dict(read_cluster_file(path)) == get_cluster(name)


def test_a_shown_cluster_file_plans_like_the_preset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "pod.yaml"
    path.write_text(runner.invoke(app, ["clusters", "--show", "dgx-h100"]).stdout)
    common = ["--model", "llama3-8b", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64", "--json"]
    from_file = runner.invoke(app, ["plan", "--cluster", str(path), *common])
    preset = runner.invoke(app, ["plan", "--cluster", "dgx-h100", *common])
    assert from_file.exit_code == preset.exit_code == 0, from_file.output
    a, b = json.loads(from_file.stdout), json.loads(preset.stdout)
    assert a["inputs"]["cluster"] == b["inputs"]["cluster"] and a["best"]["layout"] == b["best"]["layout"]


def test_an_entry_copied_from_the_preset_file_is_read_as_it_is(tmp_path) -> None:  # type: ignore[no-untyped-def]
    shown = yaml.safe_load(runner.invoke(app, ["clusters", "--show", "dgx-a100-80g"]).stdout)
    name = shown.pop("name")
    for i, wrapped in enumerate(({name: shown}, {"clusters": {name: shown}})):
        path = tmp_path / f"copied{i}.yaml"
        path.write_text(yaml.safe_dump(wrapped))
        r = runner.invoke(app, ["evaluate", "--model", "llama3-8b", "--cluster", str(path), "--gpus", "8",
                                "--global-batch", "16", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["cluster"] == name


def test_readme_cluster_example_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autopar.cli_support import read_cluster_file

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Cluster files", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme-cluster.yaml"
    path.write_text(block)
    spec = cluster_from_dict(read_cluster_file(path))
    assert spec.name == "my-h100-pod" and spec.gpu.name == "H100-80GB"
    assert spec.inter_node.nic_bandwidth_bytes_per_s == 50e9 and spec.intra_node.latency_s == pytest.approx(1.9e-6)


@pytest.mark.parametrize("command", ["plan", "evaluate"])
def test_a_missing_cluster_file_says_file_not_found(command: str) -> None:
    r = runner.invoke(app, [command, "--model", "tiny", "--cluster", "nowhere/my-cluster.yaml", "--gpus", "4",
                            "--global-batch", "8"])
    assert r.exit_code == 2
    assert "cluster file not found: nowhere/my-cluster.yaml" in r.output
    assert "unknown cluster preset" not in r.output
    _no_traceback(r)


def test_a_file_without_a_cluster_says_what_a_cluster_file_holds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "empty.yaml"
    path.write_text("just: text\n")
    r = runner.invoke(app, ["plan", "--model", "tiny", "--cluster", str(path), "--gpus", "4", "--global-batch", "8"])
    assert r.exit_code == 2 and "holds no cluster" in r.output and "gpus_per_node" in r.output


def test_gpus_lists_the_catalog_with_key_fields() -> None:
    r = runner.invoke(app, ["gpus"])
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if "H100-80GB" in line and "HBM2e" not in line)
    assert "nvidia" in row and "79.6" in row and "989" in row and "1,979" in row and "3.35" in row
    assert "memory GiB" in r.stdout and "bf16 TFLOP/s" in r.stdout


def test_models_show_prints_a_spec_that_loads_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = runner.invoke(app, ["models", "--show", "llama3-8b"])
    assert r.exit_code == 0, r.output
    spec = json.loads(r.stdout)
    assert spec["name"] == "llama3-8b" and spec["num_layers"] == 32
    path = tmp_path / "llama.json"
    path.write_text(r.stdout)
    common = ["--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16", "--json"]
    from_file = json.loads(runner.invoke(app, ["evaluate", "--model", str(path), *common]).stdout)
    preset = json.loads(runner.invoke(app, ["evaluate", "--model", "llama3-8b", *common]).stdout)
    assert from_file["model"] == preset["model"] and from_file["step_s"] == preset["step_s"]
    bad = runner.invoke(app, ["models", "--show", "no-such-model"])
    assert bad.exit_code == 2 and "no-such-model" in bad.output
    _no_traceback(bad)


@pytest.mark.parametrize("command", ["plan", "evaluate"])
def test_a_missing_global_batch_is_a_sentence_not_a_pydantic_dump(command: str) -> None:
    r = runner.invoke(app, [command, "--model", "tiny", "--cluster", "local-cpu", "--gpus", "4"])
    assert r.exit_code == 2
    assert "--global-batch N (sequences per optimizer step) or --global-batch-tokens N" in r.output
    assert "validation error" not in r.output and "pydantic" not in r.output
    _no_traceback(r)


def test_no_offload_is_spelled_as_typed_and_honoured() -> None:
    r = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    assert "--no-offload" in r.output and "--no-no-offload" not in r.output
    r = runner.invoke(app, ["plan", *TINY, "--no-offload", "--json"])
    plan = json.loads(r.stdout)
    assert plan["inputs"]["constraints"]["allow_offload"] is False
    assert not any(c["layout"]["offload_optimizer"] for c in [plan["best"], *plan["alternatives"]])


@pytest.mark.parametrize("top", [1, 2, 5])
def test_top_n_shows_n_rows(top: int) -> None:
    r = runner.invoke(app, ["plan", *TINY, "--top", str(top)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    table = r.stdout.split("best layouts", 1)[1].split("memory per pipeline stage", 1)[0]
    ranks = [int(m.group(1)) for m in re.finditer(r"^│ +(\d+) │", table, re.M)]
    assert ranks == list(range(1, top + 1))


def test_evaluate_and_plan_state_usable_memory_alike() -> None:
    common = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096", "--global-batch", "16"]
    plan_out = runner.invoke(app, ["plan", *common], env={"COLUMNS": "200"}).stdout
    plan = json.loads(runner.invoke(app, ["plan", *common, "--json"]).stdout)
    lay = plan["best"]["layout"]
    ev = runner.invoke(app, ["evaluate", *common, "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--zero", str(lay["zero_stage"]),
                             "--micro-batch", str(lay["micro_batch"]), "--recompute", lay["recompute"]],
                       env={"COLUMNS": "200"}).stdout
    usable = re.search(r"of (\d+\.\d) GiB usable", plan_out)
    assert usable is not None and usable.group(1) == "75.7"
    assert f"of {usable.group(1)} GiB usable (79.65 GiB per GPU less 5% headroom)" in ev
    assert "GiB usable" in ev and ": fits" in ev


def test_readme_documents_the_run_body() -> None:
    from api.schemas import Launch, RunCreate

    readme = (REPO / "README.md").read_text()
    section = readme.split("POST /v1/plans/{id}/runs` body", 1)[1].split("\n\n", 1)[0]
    for field in RunCreate.model_fields:
        if field != "launch":
            assert f"`{field}`" in section or f"`{field}` (required)" in section, field
    for field in Launch.model_fields:
        assert f"`launch.{field}`" in section, field
    example = re.search(r"localhost:8000/v1/plans/1/runs \\\n\s+-d '(\{.*\})'", readme)
    assert example is not None
    RunCreate.model_validate_json(example.group(1))  # the README's example body is accepted


@pytest.mark.slow
def test_readme_fake_world_example_runs_on_the_readme_plan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """README: `autopar plan --model tiny ... --json > plan.json`, then `autopar run plan.json --fake-world 256`."""
    readme = (REPO / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("autopar plan --model tiny") and "> plan.json" in x)
    argv = line.split("#")[0].split(">")[0].split()[1:]
    plan = tmp_path / "plan.json"
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    plan.write_text(r.stdout)
    assert "autopar run plan.json --fake-world 256" in readme
    r = runner.invoke(app, ["run", str(plan), "--fake-world", "256"])
    assert r.exit_code == 0, r.output
    assert "dp 4 -> 256, global batch 8 -> 512 sequences" in r.output
    rows = [x for x in r.stdout.splitlines() if re.match(r"^\s+0\s+0\s+\d", x)]
    assert len(rows) == 1, r.stdout


@pytest.mark.slow
def test_run_reports_progress_and_predicted_vs_measured(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = runner.invoke(app, ["plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "2", "--seq-len", "64",
                            "--global-batch", "4", "--json"])
    plan = tmp_path / "plan.json"
    plan.write_text(r.stdout)
    out = tmp_path / "run" / "profile.json"
    r = runner.invoke(app, ["run", str(plan), "--steps", "3", "--backend", "gloo", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "launching 2 processes" in r.output and re.search(r"step [123]/3 loss \d+\.\d{3}", r.output)
    measured = re.search(r"^measured: 3 steps, step (\d+\.\d{3}) s .*tokens/s, MFU \d+\.\d%, peak memory \d+\.\d\d GiB", r.stdout, re.M)
    assert measured is not None, r.stdout
    predicted = re.search(r"^predicted vs measured: step (\d+\.\d{3}) s vs (\d+\.\d{3}) s \(([+-]\d+\.\d)%\); peak allocated memory", r.stdout, re.M)
    assert predicted is not None, r.stdout
    assert predicted.group(2) == measured.group(1)
    assert json.loads(out.read_text())["step_times_s"] and out.with_suffix(".log").exists()
