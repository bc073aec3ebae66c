"""The cost model's per-rank peak against the runtime traced at its planned world size.

`runtime.fake_world` runs the real runtime for the first rank of every pipeline stage under a fake
process group and FakeTensorMode and measures live tensor storage; `compare_with_estimate` prices
the same layout as the trace executes it. Small models (2-4 layers of Llama-3-8B and Mixtral-8x7B
shapes) at 64-128 ranks keep each trace to a few seconds; `bench/fake_world_memory.py` runs the
whole models.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.05


def _run(model: str, layers: int, gpus: int, seq: int, gbs: int, layout: dict[str, Any]):
    from runtime.spec import load_run_spec

    spec = load_run_spec({"model": model, "training": {"seq_len": seq, "global_batch": gbs}, "gpus": gpus,
                          "layout": layout, "dtype": "bf16"})
    m = spec.model.model_dump()
    m["num_layers"] = layers
    return load_run_spec({"model": m, "training": {"seq_len": seq, "global_batch": gbs, "optimizer": "adamw"},
                          "gpus": gpus, "layout": layout, "dtype": "bf16"})


CASES = {
    # FSDP over 64 ranks, ZeRO-3, full recompute: the loss phase (eager cross-entropy) peaks
    "llama8b-fsdp64-zero3-full": ("llama3-8b", 4, 64, 8192, 64, {"zero_stage": 3, "recompute": "full"}),
    # TP8 with sequence parallel (DTensor), FSDP over 16, loss_parallel, 4 micro-batches
    "llama8b-tp8-sp-dp16-zero3": ("llama3-8b", 2, 128, 8192, 64, {"tp": 8, "zero_stage": 3}),
    # TP2 x PP2 1F1B with selective recompute: accumulated float32 gradients, full-vocabulary
    # embedding gradient, per-micro-batch receive buffers
    "llama8b-tp2-pp2-dp32-1f1b-selective": (
        "llama3-8b", 4, 128, 4096, 128, {"tp": 2, "pp": 2, "zero_stage": 1, "recompute": "selective"},
    ),
    # Mixtral EP8 over 64 ranks, ZeRO-3, full recompute: experts FSDP-sharded over edp, root group
    # gathered through the backward
    "mixtral-ep8-dp64-zero3-full": ("mixtral-8x7b", 2, 64, 4096, 64, {"ep": 8, "zero_stage": 3, "recompute": "full"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_estimate_within_5_percent_of_trace(name: str) -> None:
    run = _run(*CASES[name])
    for r in _assert_estimate_within_tolerance(name, run):
        assert r["seconds"] < 60, f"{name} stage {r['stage']} traced in {r['seconds']:.0f} s"


def _assert_estimate_within_tolerance(name: str, run: Any) -> list[dict[str, Any]]:
    """Trace every pipeline stage of `run` and check the estimate (without the allocator reserve)
    against each traced peak within TOLERANCE; returns the rows."""
    from runtime.fake_world import compare_with_estimate, measure_stages

    rows = compare_with_estimate(run, measure_stages(run, steps=2))
    assert len(rows) == run.layout.pp
    for r in rows:
        err = r["estimate_without_reserve_bytes"] / r["peak_bytes"] - 1
        assert abs(err) <= TOLERANCE, (
            f"{name} stage {r['stage']}: traced {r['peak_bytes'] / 2**30:.3f} GiB, "
            f"estimated {r['estimate_without_reserve_bytes'] / 2**30:.3f} GiB ({100 * err:+.1f}%)"
        )
    return rows


def test_cli_fake_world_on_tiny_plan(tmp_path: Path) -> None:
    """`autopar run PLAN --fake-world N` on a tiny local-cpu plan prints one row per stage."""
    env_py = [sys.executable, "-m", "autopar.cli"]
    plan = subprocess.run(
        [*env_py, "plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "4", "--seq-len", "128",
         "--global-batch", "8", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert plan.returncode == 0, plan.stderr[-3000:]
    path = tmp_path / "plan.json"
    path.write_text(plan.stdout)
    res = subprocess.run(
        [*env_py, "run", str(path), "--fake-world", "4", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(res.stdout)
    assert rows and all(r["peak_bytes"] > 0 and r["estimate_without_reserve_bytes"] > 0 for r in rows)
    assert [r["stage"] for r in rows] == list(range(len(rows)))
    for r in rows:  # a tiny model is all fixed costs; still the same order of magnitude
        assert 0.5 < r["ratio_measured_to_estimate"] < 2.0, r
    # a world the plan's model-parallel degrees do not divide: a clean error, not a traceback
    tp2 = subprocess.run(
        [*env_py, "plan", "--model", "tiny", "--cluster", "local-cpu", "--gpus", "4", "--seq-len", "128",
         "--global-batch", "8", "--tp", "2", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert tp2.returncode == 0, tp2.stderr[-3000:]
    path2 = tmp_path / "plan-tp2.json"
    path2.write_text(tp2.stdout)
    bad = subprocess.run(
        [*env_py, "run", str(path2), "--fake-world", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert bad.returncode == 2 and "cannot run on 3 ranks" in bad.stderr, bad.stderr[-2000:]


HYBRID = {  # Nemotron-H's mixers at 1/8 width: Mamba-2 (32 heads x 64, state 128, 8 groups), GQA, relu2 MLP
    "name": "hybrid-small", "family": "nemotron_h", "vocab_size": 32000, "hidden_size": 1024, "num_heads": 8,
    "num_kv_heads": 2, "head_dim": 128, "ffn_hidden_size": 4096, "mlp": "relu2", "mamba_num_heads": 32,
    "mamba_head_dim": 64, "mamba_state_size": 128, "mamba_groups": 8, "mamba_chunk_size": 128,
}
HYBRID_MOE = {"num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 1024, "num_shared_experts": 1,
              "shared_expert_ffn_hidden_size": 2048}
HYBRID_CASES = {
    # FSDP over 8 ranks, ZeRO-3, 2 micro-batches: Mamba, attention and MLP layers
    "hybrid-fsdp8-zero3": ("M-M*-M-M*-", 16, {"zero_stage": 3}),
    # PP2 1F1B with full recompute: stage 0's peak is a Mamba layer's backward (its recomputed scan)
    "hybrid-pp2-dp4-1f1b-full": ("M-M*-M-M*-", 16, {"pp": 2, "zero_stage": 1, "recompute": "full", "schedule": "1f1b"}),
    # Mamba + MoE (Nemotron 3 Nano's pattern), selective recompute
    "hybrid-moe-fsdp8-zero2-selective": ("MEM*EMEM*E", 16, {"zero_stage": 2, "recompute": "selective"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HYBRID_CASES))
def test_hybrid_estimate_within_5_percent_of_trace(name: str) -> None:
    """Hybrid Mamba-2 models (`ModelSpec.hybrid_pattern`) traced at 8 ranks, sequence 4096."""
    from runtime.spec import load_run_spec

    pattern, gbs, layout = HYBRID_CASES[name]
    model = {**HYBRID, "num_layers": len(pattern), "hybrid_pattern": pattern, **(HYBRID_MOE if "E" in pattern else {})}
    run = load_run_spec({"model": model, "training": {"seq_len": 4096, "global_batch": gbs, "optimizer": "adamw"},
                         "gpus": 8, "layout": layout, "dtype": "bf16"})
    _assert_estimate_within_tolerance(name, run)
