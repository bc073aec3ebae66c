"""Exporters: golden files per format and fixture, the files parse and describe the plan, and
what a target cannot express is reported.

Regenerate the golden files with `AUTOPAR_UPDATE_GOLDEN=1 pytest tests/planner/test_exporters.py`
and review the diff."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from cluster_specs.presets import get_cluster
from cost_models.layout import Layout, validate_layout
from cost_models.stages import even_partition
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.exporters import EXPORTERS, ExportError, export
from planner.plan import Candidate, Plan, PlanInputs, SearchStats

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("AUTOPAR_UPDATE_GOLDEN") == "1"
EXT = {"torchrun": "sh", "megatron": "sh", "deepspeed": "json", "torchtitan": "toml", "accelerate": "yaml"}


def make_plan(
    model: str,
    gpus: int,
    layout: Layout,
    partition: list[int] | None = None,
    *,
    cluster: str = "dgx-h100",
    training: TrainingSpec | None = None,
) -> Plan:
    """A Plan built by hand (no search): the layout resolved, a partition, a fixed estimate."""
    m = get_model(model)
    tr = training or TrainingSpec(seq_len=8192, global_batch=512)
    problems = validate_layout(m, tr, gpus, layout)
    assert not problems, problems
    lay = layout.resolved(gpus, tr)
    chunks = partition or list(even_partition(m.num_layers, lay.pp * lay.vpp))
    estimate = {  # the keys of cost_models.report.estimate_dict that exporters read; fixed numbers
        "ok": True,
        "fits": True,
        "gpus": gpus,
        "step_s": 12.5,
        "tokens_per_s": tr.tokens_per_step / 12.5,
        "mfu": 0.42,
        "memory": {"peak_bytes": 70 * 2**30, "capacity_bytes": 80 * 2**30},
        "partition": {"chunk_layers": chunks, "pp": lay.pp, "vpp": lay.vpp},
    }
    return Plan(
        created_at="2025-01-01T00:00:00+00:00",
        inputs=PlanInputs(model=m, cluster=get_cluster(cluster), gpus=gpus, training=tr),
        best=Candidate(layout=lay, partition=chunks, estimate=estimate),
        stats=SearchStats(generated=1, invalid=0, pruned=0, priced=1, feasible=1, seconds=0.0),
    )


def _interleaved_cut() -> list[int]:
    cut = [4] * 20
    cut[10], cut[19] = 5, 3  # one more layer mid-model, one fewer on the last (LM head) chunk
    return cut


FIXTURES = {
    # Dense, uneven first/last stages from the CP-SAT partitioner, ZeRO-1, selective recompute
    "llama3-70b": lambda: make_plan(
        "llama3-70b", 64, Layout(tp=8, pp=4, zero_stage=1, recompute="selective"), [19, 21, 21, 19]
    ),
    # Interleaved 1F1B with an arbitrary cut (needs Megatron's pipeline layout string)
    "llama3-70b-interleaved": lambda: make_plan(
        "llama3-70b", 128, Layout(tp=8, pp=4, vpp=5, recompute="full"), _interleaved_cut()
    ),
    # MoE with everything a framework may lack: CP, EP, hybrid ZeRO-3, offload, partial recompute,
    # FP8, GPipe
    "mixtral-8x7b-hybrid": lambda: make_plan(
        "mixtral-8x7b",
        64,
        Layout(
            tp=2, pp=2, cp=2, ep=4, dp_shard=4, zero_stage=3, offload_optimizer=True,
            recompute="full", recompute_layers=2, schedule="gpipe",
        ),
        [15, 17],
        training=TrainingSpec(seq_len=8192, global_batch=512, precision="fp8"),
    ),
    # MLA + first dense layers + an irregular cut
    "deepseek-v3": lambda: make_plan(
        "deepseek-v3",
        1024,
        Layout(tp=8, pp=16, ep=8, recompute="full"),
        [5, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3],
        training=TrainingSpec(seq_len=4096, global_batch=1024),
    ),
}


@pytest.fixture(params=sorted(FIXTURES))
def plan_name(request: pytest.FixtureRequest) -> str:
    return request.param


# ---- golden files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(EXPORTERS))
def test_golden(plan_name: str, fmt: str) -> None:
    result = export(FIXTURES[plan_name](), fmt)
    path = GOLDEN / f"{plan_name}.{fmt}.{EXT[fmt]}"
    lost_path = GOLDEN / f"{plan_name}.{fmt}.lost.txt"
    lost_text = "".join(f"{line}\n" for line in result.lost)
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(result.text)
        lost_path.write_text(lost_text)
    assert path.exists(), f"missing golden {path.name}: run with AUTOPAR_UPDATE_GOLDEN=1"
    assert result.text == path.read_text(), f"{path.name} changed: review, then AUTOPAR_UPDATE_GOLDEN=1"
    assert lost_text == lost_path.read_text()


def test_filenames() -> None:
    plan = FIXTURES["llama3-70b"]()
    names = {fmt: export(plan, fmt).filename for fmt in EXPORTERS}
    assert names == {
        "torchrun": "launch.sh",
        "megatron": "megatron_args.sh",
        "deepspeed": "ds_config.json",
        "torchtitan": "torchtitan.toml",
        "accelerate": "accelerate_config.yaml",
    }


# ---- the files parse and say what the plan says ----------------------------------------------------


def _megatron_args(text: str) -> dict[str, list[str]]:
    body = text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=(") : text.rindex(")")]
    tokens = shlex.split(body, comments=True)
    args: dict[str, list[str]] = {}
    flag = None
    for tok in tokens:
        if tok.startswith("--"):
            flag = tok
            args[flag] = []
        else:
            assert flag is not None
            args[flag].append(tok)
    return args


def _parse_layout(layout: str) -> list[int]:
    stages = []
    for stage in layout.split("|"):
        n = sum(int(x) for x in re.findall(r"t\*(\d+)", stage))
        stages.append(n)
    return stages


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("fmt", ["torchrun", "megatron"])
def test_shell_scripts_are_valid_bash(plan_name: str, fmt: str) -> None:
    text = export(FIXTURES[plan_name](), fmt).text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_megatron_arguments(plan_name: str) -> None:
    plan = FIXTURES[plan_name]()
    lay, model = plan.best.layout, plan.inputs.model
    args = _megatron_args(export(plan, "megatron").text)
    assert args["--tensor-model-parallel-size"] == [str(lay.tp)]
    assert args["--pipeline-model-parallel-size"] == [str(lay.pp)]
    assert args["--num-layers"] == [str(model.num_layers)]
    assert args["--micro-batch-size"] == [str(lay.micro_batch)]
    assert args["--global-batch-size"] == [str(plan.inputs.training.global_batch)]
    assert ("--sequence-parallel" in args) == lay.sp_
    # the stage cut survives exactly
    cut = plan.best.partition
    if "--pipeline-model-parallel-layout" in args:
        (layout,) = args["--pipeline-model-parallel-layout"]
        assert _parse_layout(layout) == cut
        assert layout.startswith("E,") and layout.endswith(",L")
        assert "--num-layers-per-virtual-pipeline-stage" not in args
    else:
        first = int(args.get("--decoder-first-pipeline-num-layers", [0])[0]) or None
        last = int(args.get("--decoder-last-pipeline-num-layers", [0])[0]) or None
        rest = model.num_layers - (first or 0) - (last or 0)
        middle = lay.pp - (first is not None) - (last is not None)
        expect = [first] if first else []
        expect += [rest // middle] * middle if middle else []
        expect += [last] if last else []
        assert expect == cut


def test_megatron_model_shapes() -> None:
    args = _megatron_args(export(FIXTURES["deepseek-v3"](), "megatron").text)
    assert "--multi-latent-attention" in args
    assert args["--kv-lora-rank"] == ["512"] and args["--q-lora-rank"] == ["1536"]
    assert args["--qk-head-dim"] == ["128"] and args["--qk-pos-emb-head-dim"] == ["64"]
    assert args["--moe-layer-freq"] == ["([0]*3+[1]*58)"]
    assert args["--num-experts"] == ["256"] and args["--moe-router-topk"] == ["8"]
    assert args["--moe-shared-expert-intermediate-size"] == ["2048"]
    llama = _megatron_args(export(FIXTURES["llama3-70b"](), "megatron").text)
    assert llama["--num-query-groups"] == ["8"] and "--group-query-attention" in llama
    assert "--swiglu" in llama and llama["--normalization"] == ["RMSNorm"]
    assert llama["--decoder-first-pipeline-num-layers"] == ["19"]
    assert llama["--decoder-last-pipeline-num-layers"] == ["19"]
    assert "--use-distributed-optimizer" in llama
    assert llama["--recompute-granularity"] == ["selective"]


def test_megatron_zero_and_recompute() -> None:
    args = _megatron_args(export(FIXTURES["mixtral-8x7b-hybrid"](), "megatron").text)
    assert args["--data-parallel-sharding-strategy"] == ["optim_grads_params"]
    assert args["--num-distributed-optimizer-instances"] == ["2"]  # dp 8 / dp_shard 4
    assert args["--recompute-method"] == ["block"] and args["--recompute-num-layers"] == ["2"]
    assert args["--context-parallel-size"] == ["2"]
    assert args["--expert-model-parallel-size"] == ["4"]
    assert args["--fp8-format"] == ["hybrid"]
    assert "--optimizer-cpu-offload" in args
    inter = _megatron_args(export(FIXTURES["llama3-70b-interleaved"](), "megatron").text)
    assert inter["--recompute-method"] == ["uniform"]


def test_deepspeed_config(plan_name: str) -> None:
    plan = FIXTURES[plan_name]()
    lay = plan.best.layout
    cfg = json.loads(export(plan, "deepspeed").text)
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * lay.dp
    assert cfg["zero_optimization"]["stage"] == lay.zero_stage
    if lay.pp > 1:
        assert cfg["pipeline"]["stages"] == lay.pp
    assert cfg.get("tensor_parallel", {}).get("autotp_size", 1) == lay.tp


def test_torchtitan_config(plan_name: str) -> None:
    plan = FIXTURES[plan_name]()
    lay, model = plan.best.layout, plan.inputs.model
    cfg = tomllib.loads(export(plan, "torchtitan").text)
    par = cfg["parallelism"]
    world = (
        par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * par["tensor_parallel_degree"]
        * par["pipeline_parallel_degree"] * par["context_parallel_degree"]
    )
    assert world == plan.inputs.gpus
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == lay.pp * lay.vpp
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == plan.best.partition
    flat = [m for p in parts for m in p]
    assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(model.num_layers)), "norm", "output"]
    assert par["pipeline_parallel_schedule"] == {"1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B", "gpipe": "GPipe"}[lay.schedule_]
    train = cfg["training"]
    assert train["seq_len"] == plan.inputs.training.seq_len
    assert train["global_batch_size"] == plan.inputs.training.global_batch


def test_accelerate_config(plan_name: str) -> None:
    plan = FIXTURES[plan_name]()
    cfg = yaml.safe_load(export(plan, "accelerate").text)
    assert cfg["distributed_type"] == "FSDP"
    assert cfg["fsdp_config"]["fsdp_version"] == 2
    par = cfg["parallelism_config"]
    world = (
        par["parallelism_config_dp_replicate_size"] * par["parallelism_config_dp_shard_size"]
        * par["parallelism_config_tp_size"] * par["parallelism_config_cp_size"]
    )
    assert world == cfg["num_processes"] == plan.inputs.gpus
    assert cfg["num_machines"] == plan.inputs.gpus // 8


def test_torchrun_command() -> None:
    text = export(FIXTURES["llama3-70b"](), "torchrun").text
    assert "--nnodes 8" in text and "--nproc-per-node 8" in text
    assert "--rdzv-backend c10d" in text
    assert '--rdzv-endpoint "$MASTER_ADDR:29500"' in text
    assert text.rstrip().endswith("-m runtime.launch plan.json")


# ---- lost features ---------------------------------------------------------------------------------


def _has(lost: list[str], *needles: str) -> bool:
    return all(any(n.lower() in line.lower() for line in lost) for n in needles)


def test_nothing_lost_where_the_target_expresses_everything() -> None:
    plan = FIXTURES["llama3-70b"]()
    assert export(plan, "torchrun").lost == []
    assert export(plan, "megatron").lost == []
    # the uneven cut is written as module FQNs; only ZeRO-1 has no FSDP2 equivalent
    lost = export(plan, "torchtitan").lost
    assert len(lost) == 1 and lost[0].startswith("ZeRO-1")


def test_deepspeed_reports_what_it_cannot_express() -> None:
    lost = export(FIXTURES["mixtral-8x7b-hybrid"](), "deepspeed").lost
    assert _has(lost, "context parallelism")
    assert _has(lost, "expert parallelism")
    assert _has(lost, "hybrid sharding", "zero_hpz_partition_size")
    assert _has(lost, "ZeRO-3 with pipeline")
    assert _has(lost, "FP8")
    assert _has(lost, "GPipe")
    assert _has(lost, "stage cut 15 | 17")
    assert _has(export(FIXTURES["llama3-70b-interleaved"](), "deepspeed").lost, "interleaved")


def test_accelerate_reports_pipeline_and_experts() -> None:
    lost = export(FIXTURES["mixtral-8x7b-hybrid"](), "accelerate").lost
    assert _has(lost, "pipeline parallelism (pp=2")
    assert _has(lost, "expert parallelism (ep=4)")
    assert _has(lost, "optimizer-only CPU offload")
    assert _has(lost, "recompute of 2 layers")
    assert _has(export(FIXTURES["llama3-70b"](), "accelerate").lost, "ZeRO-1")


def test_torchtitan_reports_what_it_cannot_express() -> None:
    lost = export(FIXTURES["mixtral-8x7b-hybrid"](), "torchtitan").lost
    assert _has(lost, "recompute of 2 layers")
    assert _has(lost, "enable_cpu_offload")
    assert not _has(lost, "stage cut")  # module_fqns_per_model_part expresses any cut


def test_megatron_reports_gpipe_and_interleaved_recompute_count() -> None:
    lost = export(FIXTURES["mixtral-8x7b-hybrid"](), "megatron").lost
    assert _has(lost, "GPipe")
    plan = make_plan("llama3-70b", 128, Layout(tp=8, pp=4, vpp=5, recompute="full", recompute_layers=3))
    assert _has(export(plan, "megatron").lost, "per virtual stage")


def test_model_features_megatron_lacks() -> None:
    plan = make_plan("gpt-oss-20b", 32, Layout(tp=4, pp=2, ep=4), training=TrainingSpec(seq_len=4096, global_batch=64))
    lost = export(plan, "megatron").lost
    assert _has(lost, "sliding-window") and _has(lost, "attention sinks")


def test_partial_nodes_are_reported() -> None:
    plan = make_plan("llama3-8b", 4, Layout(tp=4), training=TrainingSpec(seq_len=4096, global_batch=8))
    text = export(plan, "torchrun").text
    assert "--nnodes 1" in text and "--nproc-per-node 4" in text
    assert export(plan, "torchrun").lost == []
    odd = make_plan("llama3-8b", 12, Layout(tp=4), training=TrainingSpec(seq_len=4096, global_batch=12))
    assert _has(export(odd, "torchrun").lost, "do not fill 2 nodes")


# ---- errors ------------------------------------------------------------------------------------------


def test_unknown_format() -> None:
    with pytest.raises(ExportError, match="unknown export format 'nemo'.*torchrun, megatron"):
        export(FIXTURES["llama3-70b"](), "nemo")


def test_format_name_is_case_insensitive() -> None:
    assert export(FIXTURES["llama3-70b"](), " Megatron ").filename == "megatron_args.sh"


def test_infeasible_plan_cannot_be_exported() -> None:
    plan = FIXTURES["llama3-70b"]()
    plan.best = None
    with pytest.raises(ExportError, match="no feasible layout"):
        export(plan, "torchrun")


def test_bad_partition_is_rejected() -> None:
    plan = FIXTURES["llama3-70b"]()
    assert plan.best is not None
    plan.best.partition = [40, 40]
    with pytest.raises(ExportError, match="does not cut 80 layers"):
        export(plan, "megatron")
