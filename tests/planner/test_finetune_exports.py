"""Fine-tuning plans in their stack (planner.finetune) and the files those stacks read
(planner.exporters.hf, .torchtune), checked by the stacks' own parsers (tests/planner/consumers)."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.exporters import ExportError, export
from planner.finetune import search_finetune, techniques_of
from planner.plan import Plan, SearchConstraints

CONSUMERS = Path(__file__).parent / "consumers"

JOBS = {
    # name: (model, cluster, gpus, training fields, constraints)
    "hf-qlora-8b-24gb": ("llama3-8b", "rtx4090-pcie-8", 1, {"method": "qlora"}, {}),
    "hf-lora-8b-48gb": ("llama3-8b", "l40s-pcie-8", 1, {"method": "lora", "lora_targets": ["q_proj", "v_proj"]}, {}),
    "hf-lora-70b-8x80gb": ("llama3-70b", "dgx-h100", 8, {"method": "lora"}, {}),
    "hf-dora-8b-deepspeed": ("llama3-8b", "dgx-h100", 8, {"method": "lora", "dora": True},
                             {"framework": "deepspeed", "stack": "hf"}),
    "tt-qlora-8b-24gb": ("llama3-8b", "rtx4090-pcie-8", 1, {"method": "qlora"}, {"stack": "torchtune"}),
    "tt-lora-70b-8x80gb": ("llama3-70b", "dgx-h100", 8, {"method": "lora"}, {"stack": "torchtune"}),
    "tt-full-8b-48gb": ("llama3-8b", "l40s-pcie-8", 1, {"method": "full"}, {"stack": "torchtune"}),
    "hf-full-0.6b-fp32": ("qwen3-0.6b", "l40s-pcie-8", 1, {"method": "full", "master_weights": True}, {"stack": "hf"}),
    "hf-full-0.6b-bf16": ("qwen3-0.6b", "l40s-pcie-8", 1, {"method": "full"}, {"stack": "hf"}),
}


@cache
def plan_of(name: str) -> Plan:
    model, cluster, gpus, fields, constraints = JOBS[name]
    training = TrainingSpec(seq_len=2048, global_batch=16, **fields)
    return search_finetune(get_model(model), training, get_cluster(cluster), gpus, SearchConstraints(**constraints))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_job_plans_in_its_stack_and_names_the_techniques(name: str) -> None:
    plan = plan_of(name)
    assert plan.best is not None, plan.why
    lay = plan.best.layout
    assert lay.stack == ("torchtune" if name.startswith("tt") else "hf")
    assert lay.framework != "megatron" and lay.tp == lay.pp == lay.cp == 1
    assert plan.why[0].startswith(f"stack {lay.stack} (")
    for technique in techniques_of(lay, "chunked" if lay.stack == "torchtune" else "eager"):
        assert technique in plan.why[0]


def test_a_lora_plan_defaults_to_the_hf_stack_and_a_full_one_does_not() -> None:
    tr = TrainingSpec(seq_len=1024, global_batch=8, method="lora")
    lora = search_finetune(get_model("llama3-8b"), tr, get_cluster("dgx-h100"), 8)
    assert lora.best is not None and lora.best.layout.stack == "hf" and lora.best.layout.framework == "fsdp"
    full = search_finetune(get_model("llama3-8b"), TrainingSpec(seq_len=1024, global_batch=8), get_cluster("dgx-h100"), 8)
    assert full.best is not None and full.best.layout.stack is None and full.best.layout.framework == "megatron"


def test_techniques_are_chosen_only_when_they_are_needed() -> None:
    """On a 24 GB GPU the 8B QLoRA needs activation checkpointing (4 x 2048 tokens of a 32-layer base do not
    fit without it); on 8 H100s the same job needs none."""
    small = plan_of("hf-qlora-8b-24gb")
    assert small.best is not None and small.best.layout.recompute == "full"
    tr = TrainingSpec(seq_len=2048, global_batch=16, method="qlora")
    big = search_finetune(get_model("llama3-8b"), tr, get_cluster("dgx-h100"), 8)
    assert big.best is not None and techniques_of(big.best.layout, "eager") == []


def test_a_pinned_technique_is_kept_and_the_search_can_be_turned_off() -> None:
    tr = TrainingSpec(seq_len=2048, global_batch=16, method="lora")
    c = SearchConstraints(stack="torchtune", recompute="full", offload_activations=True, search_techniques=False)
    plan = search_finetune(get_model("llama3-8b"), tr, get_cluster("l40s-pcie-8"), 1, c)
    assert plan.best is not None and plan.best.layout.offload_activations and plan.best.layout.recompute == "full"
    assert "searched 1 combinations" in plan.why[0]


def _consumer(fmt: str, names: list[str], tmp_path: Path) -> dict[str, dict]:
    manifest = []
    for name in names:
        result = export(plan_of(name), fmt)
        path = tmp_path / f"{name}.{result.filename}"
        path.write_text(result.text)
        recipe = result.text.split("(recipe ", 1)[1].split(")", 1)[0] if fmt == "torchtune" else None
        manifest.append({"name": name, "path": str(path), "recipe": recipe})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run([sys.executable, str(CONSUMERS / f"check_{fmt}.py"), str(tmp_path / "manifest.json")],
                          capture_output=True, text=True, timeout=600)
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == len(manifest), proc.stderr[-4000:]
    rejected = {r["name"]: r["error"] for r in results if not r["ok"]}
    assert not rejected, rejected
    return {r["name"]: r["values"] for r in results}


@pytest.mark.slow
def test_the_hf_stack_reads_the_hf_exports(tmp_path: Path) -> None:
    names = [n for n in JOBS if n.startswith("hf")]
    for name, got in _consumer("hf", names, tmp_path).items():
        lay = plan_of(name).best.layout  # type: ignore[union-attr]
        tr = plan_of(name).inputs.training
        assert got["args"]["micro_batch"] == lay.micro_batch and got["args"]["accum"] == lay.grad_accum_
        fsdp_ckpt = lay.framework == "fsdp" and plan_of(name).inputs.gpus > 1  # then the Accelerate plugin checkpoints
        assert got["args"]["checkpointing"] == (lay.recompute == "full" and not fsdp_ckpt)
        assert got["args"]["liger"] == (lay.cross_entropy_ == "fused_linear")
        if tr.frozen_base:
            assert got["lora"]["r"] == tr.lora_rank_ and got["lora"]["use_dora"] == tr.dora
        else:  # what the plan priced: a float32 model under bf16 autocast, or a bf16 model
            assert got["model"]["dtype"] == ("float32" if tr.master_weights else "bfloat16") and got["args"]["bf16"]
        assert ("bnb" in got) == (tr.method == "qlora")
        assert got["accelerate"]["num_processes"] == plan_of(name).inputs.gpus
        expected = "NO" if plan_of(name).inputs.gpus == 1 else ("DEEPSPEED" if lay.framework == "deepspeed" else "FSDP")
        assert got["accelerate"]["distributed_type"].endswith(expected)


@pytest.mark.slow
def test_torchtune_reads_the_torchtune_exports(tmp_path: Path) -> None:
    names = [n for n in JOBS if n.startswith("tt")]
    for name, got in _consumer("torchtune", names, tmp_path).items():
        plan = plan_of(name)
        lay, tr = plan.best.layout, plan.inputs.training  # type: ignore[union-attr]
        assert got["batch_size"] == lay.micro_batch and got["accum"] == lay.grad_accum_
        assert got["checkpointing"] == (lay.recompute == "full") and got["offloading"] == lay.offload_activations
        assert got["quantize_base"] == (True if tr.method == "qlora" else (False if tr.frozen_base else None))
        assert got["recipe"].startswith("lora" if tr.frozen_base else "full")
        assert got["recipe"].endswith("distributed" if plan.inputs.gpus > 1 else "single_device")
        assert got["model"] == "torchtune.models.llama3_1." + ("lora_" if tr.frozen_base else "") + "llama3_1"


def test_a_full_hf_plan_exports_and_explains_the_weights_it_priced() -> None:
    """bf16=True over a float32 model (mixed precision by autocast: 4 + 4 + 8 bytes and the casts) or over a
    bf16 one (2 + 2 + 4): the exported `dtype` and the plan's first sentence say which was priced."""
    fp32, bf16 = plan_of("hf-full-0.6b-fp32"), plan_of("hf-full-0.6b-bf16")
    assert fp32.best is not None and bf16.best is not None
    assert "float32 weights, gradients and AdamW states under bf16 autocast" in fp32.why[0]
    assert "bf16 weights and optimizer states, no float32 master" in bf16.why[0]
    for plan, dtype in ((fp32, "float32"), (bf16, "bfloat16")):
        cfg = yaml.safe_load(export(plan, "hf").text)
        assert cfg["model"]["dtype"] == dtype and cfg["training_arguments"]["bf16"] is True
    params = [p.best.estimate["memory"]["stages"][0]["parameters_bytes"] for p in (fp32, bf16)]  # type: ignore[union-attr]
    assert params[0] > 2 * params[1]  # 4 bytes and the 2-byte casts of the GEMM weights against 2 bytes


def test_each_stack_exports_only_its_own_plans() -> None:
    with pytest.raises(ExportError, match="stack hf"):
        export(plan_of("hf-lora-8b-48gb"), "torchtune")
    with pytest.raises(ExportError, match="stack torchtune"):
        export(plan_of("tt-lora-70b-8x80gb"), "hf")
