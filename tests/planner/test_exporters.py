"""Exporters: golden files per format and fixture; the files parse and describe the plan; each
framework's own parser and validation accepts them (tests/planner/consumers/); what a target
cannot express is reported, in the file itself too; names are data (property tests that run the
exported shell and parse the YAML, TOML and JSON with names full of metacharacters).

Regenerate the golden files with `AUTOPAR_UPDATE_GOLDEN=1 pytest tests/planner/test_exporters.py`
and review the diff."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_specs.presets import get_cluster
from cost_models.layout import Layout, validate_layout
from cost_models.stages import StagePartition, even_partition, megatron_split
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.exporters import ExportError, export, formats
from planner.exporters.torchtitan import flavor_of
from planner.plan import Candidate, Plan, PlanInputs, SearchStats

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("AUTOPAR_UPDATE_GOLDEN") == "1"
EXT = {"torchrun": "sh", "megatron": "sh", "deepspeed": "json", "torchtitan": "toml", "torchtitan-0.3": "py",
       "accelerate": "yaml"}


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
    lay = layout.resolved(gpus, tr)
    given = StagePartition.explicit(partition, lay) if partition is not None else None
    problems = validate_layout(m, tr, gpus, layout, given)
    assert not problems, problems
    if partition is None and lay.uneven_split:
        partition = list(
            megatron_split(
                m.num_layers, lay.pp, lay.vpp,
                account_for_embedding=lay.account_for_embedding_in_pipeline_split,
                account_for_loss=lay.account_for_loss_in_pipeline_split,
                first_stage_layers=lay.decoder_first_pipeline_num_layers,
                last_stage_layers=lay.decoder_last_pipeline_num_layers,
            )
        )
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
    # The reference jobs. Llama-3-70B on 512 H100: TP4 PP4 CP2 VPP5 (NVIDIA's recipe shape)
    "llama3-70b-512": lambda: make_plan(
        "llama3-70b", 512, Layout(tp=4, pp=4, cp=2, vpp=5), training=TrainingSpec(seq_len=8192, global_batch=512)
    ),
    # Llama-3-8B on one 8 x H100 node: FSDP (ZeRO-3, fp32 gradient reduction), full recompute,
    # priced for the fsdp framework
    "llama3-8b-fsdp": lambda: make_plan(
        "llama3-8b", 8, Layout(zero_stage=3, micro_batch=2, recompute="full", framework="fsdp"),
        training=TrainingSpec(seq_len=8192, global_batch=64, grad_dtype="fp32"),
    ),
    # torch.distributed.pipelining's zero-bubble schedule (ZB1P), interleaved over two chunks per rank
    "llama3-8b-zero-bubble": lambda: make_plan(
        "llama3-8b", 32,
        Layout(tp=2, pp=2, vpp=2, zero_stage=2, schedule="zero_bubble", recompute="selective", framework="fsdp"),
        training=TrainingSpec(seq_len=8192, global_batch=64),
    ),
    # DualPipeV (two chunks per rank as a V) with expert parallelism: torchtitan's EP overlap
    "mixtral-8x7b-dualpipev": lambda: make_plan(
        "mixtral-8x7b", 64,
        Layout(pp=4, vpp=2, ep=8, zero_stage=1, schedule="dualpipev", recompute="selective", framework="fsdp"),
        training=TrainingSpec(seq_len=4096, global_batch=128),
    ),
    # DeepSpeed AutoTP on one node: deepspeed.initialize needs the TP-aware mpu the file names
    "llama3-8b-deepspeed-tp": lambda: make_plan(
        "llama3-8b", 8, Layout(tp=2, zero_stage=1, framework="deepspeed"), training=TrainingSpec(seq_len=4096, global_batch=32),
    ),
    # DeepSpeed's pipeline engine with tp 2 (Accelerate's plugin cannot use its ds_config.json)
    "llama3-8b-deepspeed-pipe": lambda: make_plan(
        "llama3-8b", 16, Layout(tp=2, pp=2, zero_stage=1, micro_batch=2, recompute="full", framework="deepspeed"),
        training=TrainingSpec(seq_len=4096, global_batch=64),
    ),
    # Llama-3.1-405B with Megatron's own split options: 126 + embedding + loss = 128 = 8 x 8 x 2
    "llama3-405b-split": lambda: make_plan(
        "llama3-405b", 512,
        Layout(
            tp=8, pp=8, vpp=8, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
        ),
        training=TrainingSpec(seq_len=8192, global_batch=512),
    ),
    # LoRA rank 16 on the attention projections of Llama-3-8B, FSDP over 2 nodes
    "llama3-8b-lora": lambda: make_plan(
        "llama3-8b", 16, Layout(zero_stage=3, recompute="full", framework="fsdp"),
        training=TrainingSpec(seq_len=4096, global_batch=32, method="lora", lora_targets="attention"),
    ),
    # QLoRA of LLaMA-65B on one 48 GB GPU (the QLoRA paper's headline), optimizer offloaded
    "llama-65b-qlora": lambda: make_plan(
        "llama-65b", 1, Layout(zero_stage=2, offload_optimizer=True, recompute="full", micro_batch=2, framework="deepspeed"),
        cluster="l40s-pcie-8",
        training=TrainingSpec(seq_len=512, global_batch=16, method="qlora", lora_rank=64, lora_alpha=16),
    ),
    # ZeRO-Infinity and ZeRO++ on two DGX A100: states and weight shards on NVMe, hpZ over each
    # node, int8 weight gathers and int4 gradient reduce-scatters
    "llama3-70b-zero-infinity": lambda: make_plan(
        "llama3-70b", 16,
        Layout(
            zero_stage=3, offload_optimizer=True, offload_params=True, offload_device="nvme", recompute="full",
            zero_hpz_partition_size=8, zero_quantized_weights=True, zero_quantized_gradients=True, framework="deepspeed",
        ),
        cluster="dgx-a100-80g",
        training=TrainingSpec(seq_len=4096, global_batch=32),
    ),
    # DeepSeek-V3 on 2048 H800 in FP8: PP16 EP64, first/last pipeline ranks 3 and 2 layers
    "deepseek-v3-h800-fp8": lambda: make_plan(
        "deepseek-v3", 2048,
        Layout(pp=16, ep=64, decoder_first_pipeline_num_layers=3, decoder_last_pipeline_num_layers=2, recompute="full"),
        cluster="dgx-h800",
        training=TrainingSpec(seq_len=4096, global_batch=15360, precision="fp8"),
    ),
    # DeepSeek-V3's paper degrees under Megatron's combined 1F1B (bench.deepseek_v3_paper): 32 chunks,
    # 120 micro-batches per pipeline in groups of 20
    "deepseek-v3-paper": lambda: make_plan(
        "deepseek-v3", 2048,
        Layout(
            pp=16, ep=64, vpp=2, moe_a2a_overlap=True, moe_token_dispatcher="flex", recompute="selective",
            recompute_modules=["layernorm", "mla_up_proj", "act", "core_attn"],
        ),
        [1] + [2] * 29 + [1, 1],
        cluster="dgx-h800",
        training=TrainingSpec(seq_len=4096, global_batch=15360, precision="fp8"),
    ),
}


@pytest.fixture(params=sorted(FIXTURES))
def plan_name(request: pytest.FixtureRequest) -> str:
    return request.param


# ---- golden files ---------------------------------------------------------------------------------


def _export_or_refusal(plan: Plan, fmt: str) -> tuple[object | None, str | None]:
    """The export, or the reason the format refuses the plan: torchtitan 0.3 starts from a model torchtitan
    ships (a model it lacks has no config module); Accelerate has no pipeline, so a batch that does not
    split over every GPU as a data-parallel rank cannot be written."""
    try:
        return export(plan, fmt), None
    except ExportError as exc:
        assert (fmt == "torchtitan-0.3" and "has no model of" in str(exc)) or (
            fmt == "accelerate" and "does not split over" in str(exc)), exc
        return None, str(exc)


@pytest.mark.parametrize("fmt", formats())
def test_golden(plan_name: str, fmt: str) -> None:
    result, refused = _export_or_refusal(FIXTURES[plan_name](), fmt)
    if refused is not None:
        path = GOLDEN / f"{plan_name}.{fmt}.refused.txt"
        if UPDATE:
            path.write_text(refused + "\n")
        assert path.read_text() == refused + "\n"
        return
    assert result is not None
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
    names = {fmt: export(plan, fmt).filename for fmt in formats()}
    assert names == {
        "torchrun": "launch.sh",
        "megatron": "megatron_args.sh",
        "deepspeed": "ds_config.json",
        "torchtitan": "torchtitan.toml",
        "torchtitan-0.3": "autopar_torchtitan.py",
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
    assert args.get("--pipeline-model-parallel-size", ["1"]) == [str(lay.pp)]
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
    elif lay.pp > 1:
        first = args.get("--decoder-first-pipeline-num-layers")
        last = args.get("--decoder-last-pipeline-num-layers")
        vpp = int(args.get("--num-virtual-stages-per-pipeline-rank", ["1"])[0])
        if "--num-layers-per-virtual-pipeline-stage" in args:
            vpp = model.num_layers // lay.pp // int(args["--num-layers-per-virtual-pipeline-stage"][0])
        expect = megatron_split(
            model.num_layers, lay.pp, vpp,
            account_for_embedding="--account-for-embedding-in-pipeline-split" in args,
            account_for_loss="--account-for-loss-in-pipeline-split" in args,
            first_stage_layers=int(first[0]) if first else None,
            last_stage_layers=int(last[0]) if last else None,
        )
        assert list(expect) == cut


def test_megatron_model_shapes() -> None:
    args = _megatron_args(export(FIXTURES["deepseek-v3"](), "megatron").text)
    assert "--multi-latent-attention" in args
    assert args["--kv-lora-rank"] == ["512"] and args["--q-lora-rank"] == ["1536"]
    assert args["--qk-head-dim"] == ["128"] and args["--qk-pos-emb-head-dim"] == ["64"]
    assert args["--moe-layer-freq"] == ["([0]*3+[1]*58)"]
    assert args["--num-experts"] == ["256"] and args["--moe-router-topk"] == ["8"]
    assert args["--moe-shared-expert-intermediate-size"] == ["2048"]
    assert args["--mtp-num-layers"] == ["1"]  # the plan priced the MTP module: the run trains it
    llama = _megatron_args(export(FIXTURES["llama3-70b"](), "megatron").text)
    assert "--mtp-num-layers" not in llama
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
    ds_dp = plan.inputs.gpus // (lay.tp * lay.pp)  # DeepSpeed has no CP: its data-parallel size
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * ds_dp
    assert cfg["train_batch_size"] == plan.inputs.training.global_batch
    assert cfg["zero_optimization"]["stage"] == (min(lay.zero_stage, 1) if lay.pp > 1 else lay.zero_stage)
    assert cfg["autopar"]["not_expressible"] == export(plan, "deepspeed").lost
    if lay.pp > 1:
        assert cfg["pipeline"]["stages"] == lay.pp
    # AutoTP without a pipeline; a PipelineModule's tensor parallelism is its topology's num_mp (model code)
    assert cfg.get("tensor_parallel", {}).get("autotp_size", 1) == (lay.tp if lay.pp == 1 else 1)
    lines = cfg["autopar"]["initialize"]
    if lay.pp > 1:
        assert f"num_pp={lay.pp}, num_mp={lay.tp}, num_dp={ds_dp}" in "\n".join(lines)
    assert lines[-1].endswith("mpu=groups)") == (lay.tp > 1 and lay.pp == 1)


def test_torchtitan_config(plan_name: str) -> None:
    plan = FIXTURES[plan_name]()
    lay, model = plan.best.layout, plan.inputs.model
    cfg = tomllib.loads(export(plan, "torchtitan").text)
    train = cfg["training"]
    assert train["seq_len"] == plan.inputs.training.seq_len
    assert train["global_batch_size"] == plan.inputs.training.global_batch
    par = cfg["parallelism"]
    world = (
        par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * par["tensor_parallel_degree"]
        * par["pipeline_parallel_degree"] * par["context_parallel_degree"]
    )
    assert world == plan.inputs.gpus
    if lay.pp == 1:
        assert "module_fqns_per_model_part" not in par
        return
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == lay.pp * lay.vpp
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == plan.best.partition
    flat = [m for p in parts for m in p]
    assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(model.num_layers)), "norm", "output"]
    assert par["pipeline_parallel_schedule"] == {
        "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B", "gpipe": "GPipe", "zero_bubble": "InterleavedZeroBubble",
        "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV", "looped_bfs": "LoopedBFS",
    }[lay.schedule_]


def test_accelerate_config(plan_name: str) -> None:
    plan = FIXTURES[plan_name]()
    result, refused = _export_or_refusal(plan, "accelerate")
    if result is None:  # DeepSeek-V3's 15,360 sequences over 2,048 GPUs as data-parallel ranks: 7.5 each
        assert plan.inputs.training.global_batch % plan.inputs.gpus
        return
    cfg = yaml.safe_load(result.text)
    assert cfg["num_processes"] == plan.inputs.gpus
    lay = plan.best.layout
    if lay.framework == "deepspeed":  # DeepSpeed's plugin, never FSDP keys beside it
        assert cfg["distributed_type"] == "DEEPSPEED" and "fsdp_config" not in cfg and "parallelism_config" not in cfg
        ds = cfg["deepspeed_config"]
        if lay.pp == 1 and lay.tp == 1:  # the plan's ds_config.json, and nothing Accelerate refuses beside it
            assert ds["deepspeed_config_file"] == "ds_config.json" and "mixed_precision" not in cfg
            assert set(ds) == {"deepspeed_config_file", "deepspeed_multinode_launcher", "zero3_init_flag"}
        else:
            assert "deepspeed_config_file" not in ds and ds["zero_stage"] == lay.zero_stage
    else:
        assert cfg["distributed_type"] == "FSDP"
        assert cfg["fsdp_config"]["fsdp_version"] == 2
        par = cfg["parallelism_config"]
        world = (
            par["parallelism_config_dp_replicate_size"] * par["parallelism_config_dp_shard_size"]
            * par["parallelism_config_tp_size"] * par["parallelism_config_cp_size"]
        )
        assert world == plan.inputs.gpus
    assert cfg["num_machines"] == -(-plan.inputs.gpus // 8)  # whole nodes (one GPU of one node included)
    assert "main_process_ip" not in cfg  # given on the launch line, never a placeholder


def test_torchrun_command() -> None:
    plan = FIXTURES["llama3-70b"]()
    text = export(plan, "torchrun").text
    assert "--nnodes 8" in text and "--nproc-per-node 8" in text
    assert "--rdzv-backend c10d" in text
    assert '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in text and 'MASTER_PORT="${MASTER_PORT:-29500}"' in text
    assert '-m runtime.launch "$AUTOPAR_PLAN" "$@"' in text  # the autopar runtime, as an option
    assert text.rstrip().endswith('"$@"')  # by default: the user's own script and its arguments
    for key, value in {"AUTOPAR_TP": "8", "AUTOPAR_PP": "4", "AUTOPAR_DP": "2", "AUTOPAR_STAGE_LAYERS": "19,21,21,19"}.items():
        assert f"export {key}={value}\n" in text


# ---- lost features ---------------------------------------------------------------------------------


def _has(lost: list[str], *needles: str) -> bool:
    return all(any(n.lower() in line.lower() for line in lost) for n in needles)


def test_nothing_lost_where_the_target_expresses_everything() -> None:
    plan = FIXTURES["llama3-70b"]()
    assert export(plan, "torchrun").lost == []
    assert export(plan, "megatron").lost == []
    assert "Everything the plan priced is expressed in this Megatron-LM file." in export(plan, "megatron").text
    # the uneven cut is written as module FQNs; ZeRO-1 and bf16 gradient reduction have no FSDP2
    # equivalent, Megatron's selective recompute is not torchtitan's, and the plan was priced for
    # Megatron's kernels and overlap
    lost = export(plan, "torchtitan").lost
    assert sorted(line.split(":")[0] for line in lost) == [
        "ZeRO-1", "bf16 gradient reduction", "priced for framework 'megatron'", "selective recompute",
    ]
    fsdp = FIXTURES["llama3-8b-fsdp"]()
    assert export(fsdp, "torchtitan").lost == []
    assert _has(export(fsdp, "megatron").lost, "priced for framework 'fsdp'")


@pytest.mark.parametrize("fmt", formats())
def test_what_is_lost_is_written_in_the_file(plan_name: str, fmt: str) -> None:
    """The notes survive a redirect: every lost line is in the file itself (a comment, or the
    `autopar.not_expressible` key of the DeepSpeed JSON)."""
    result, refused = _export_or_refusal(FIXTURES[plan_name](), fmt)
    if result is None:
        return  # nothing written (test_golden holds the reason)
    if fmt == "deepspeed":
        assert json.loads(result.text)["autopar"]["not_expressible"] == result.lost
        return
    comments = [line[2:] for line in result.text.splitlines() if line.startswith("# ")]
    for line in result.lost:
        assert f"- {line}" in comments


def test_deepspeed_reports_what_it_cannot_express() -> None:
    lost = export(FIXTURES["mixtral-8x7b-hybrid"](), "deepspeed").lost
    assert _has(lost, "context parallelism")
    assert _has(lost, "expert parallelism")
    assert _has(lost, "hybrid sharding over groups of 4")
    assert _has(lost, "ZeRO-3 with pipeline", "written as ZeRO-1")
    assert _has(lost, "cp=2", "global batch 512 kept")
    assert _has(lost, "FP8")
    assert _has(lost, "GPipe")
    assert _has(lost, "stage cut 15 | 17")
    assert _has(export(FIXTURES["llama3-70b-interleaved"](), "deepspeed").lost, "interleaved")


def test_deepspeed_export_of_an_older_release_says_it_writes_todays() -> None:
    """A plan priced as DeepSpeed 0.3.13 runs ZeRO-3 (cost_models.zero3_gathers) is exported for
    today's release, which gathers per module: `lost` says so; a plan of today's release says nothing."""
    tr = TrainingSpec(seq_len=4096, global_batch=32)
    old = make_plan("llama3-8b", 8, Layout(zero_stage=3, framework="deepspeed", framework_version="0.3.13"), training=tr)
    assert _has(export(old, "deepspeed").lost, "DeepSpeed 0.3.13", "written for DeepSpeed 0.19.8")
    today = make_plan("llama3-8b", 8, Layout(zero_stage=3, framework="deepspeed"), training=tr)
    assert not _has(export(today, "deepspeed").lost, "priced as DeepSpeed")


def test_every_export_of_a_triton_attention_plan_says_its_target_attends_faster() -> None:
    """A plan priced with llm-foundry's FlashAttention in Triton (`Layout.attention_kernel` triton_flash)
    runs another kernel in every target, at least twice as fast as priced: each export says which; a plan
    priced with the target's own kernel says nothing of it."""
    tr = TrainingSpec(seq_len=8192, global_batch=32)
    triton = make_plan("llama3-8b", 8, Layout(zero_stage=3, framework="fsdp", attention_kernel="triton_flash"), training=tr)
    flash = make_plan("llama3-8b", 8, Layout(zero_stage=3, framework="fsdp"), training=tr)
    for fmt in ("torchtitan", "accelerate", "deepspeed", "megatron", "torchtitan-0.3"):
        assert _has(export(triton, fmt).lost, "FlashAttention in Triton", "at least twice as fast"), fmt
        assert not _has(export(flash, fmt).lost, "FlashAttention in Triton"), fmt


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


def test_megatron_names_an_expert_grid_priced_without_moe_parallel_folding() -> None:
    """A layout priced with Megatron-Core 0.9's expert grid (EP inside DP): the arguments are the
    same, but with CP > 1 a folding Megatron-Core places the EP groups elsewhere, and the file says so."""
    training = TrainingSpec(seq_len=8192, global_batch=64)
    unfolded = make_plan("mixtral-8x7b", 64, Layout(tp=2, cp=2, ep=8, moe_parallel_folding=False), training=training)
    args = _megatron_args(export(unfolded, "megatron").text)
    assert args["--expert-model-parallel-size"] == ["8"] and args["--expert-tensor-parallel-size"] == ["2"]
    assert _has(export(unfolded, "megatron").lost, "without MoE parallel folding")
    no_cp = make_plan("mixtral-8x7b", 64, Layout(tp=2, ep=8, moe_parallel_folding=False), training=training)
    assert not _has(export(no_cp, "megatron").lost, "folding")  # cp = 1: the same ranks either way
    folded = make_plan("mixtral-8x7b", 64, Layout(tp=2, cp=2, ep=8), training=training)
    assert not _has(export(folded, "megatron").lost, "folding")


def test_megatron_fsdp_priced_without_gradient_fusion_turns_it_off() -> None:
    """A Megatron FSDP layout priced with gradient-accumulation fusion off (NeMo 2.3 / 2.4's stack)
    exports --no-gradient-accumulation-fusion; the default (fusion kept, Megatron-Core 0.14+) and the
    distributed optimizer do not."""
    training = TrainingSpec(seq_len=4096, global_batch=64)
    for zero, fused, off in ((3, False, True), (3, True, False), (1, False, False)):
        plan = make_plan("llama3-8b", 16, Layout(tp=2, zero_stage=zero, megatron_fsdp_gradient_fusion=fused), training=training)
        args = _megatron_args(export(plan, "megatron").text)
        assert ("--no-gradient-accumulation-fusion" in args) == off


def test_megatron_names_tp_overlap_priced_exposed_beside_its_fsdp_before_blackwell() -> None:
    """Megatron-FSDP with TP (or CP) on H100: the file keeps --tp-comm-overlap (the user may still set
    it) but says the step was priced with that traffic exposed; not so with the distributed optimizer,
    nor on GB200."""
    zero3 = export(make_plan("llama3-70b", 64, Layout(tp=4, zero_stage=3)), "megatron")
    assert "--tp-comm-overlap" in _megatron_args(zero3.text)
    assert _has(zero3.lost, "beside Megatron-FSDP")
    assert not _has(export(make_plan("llama3-70b", 64, Layout(tp=4, pp=2)), "megatron").lost, "beside Megatron-FSDP")
    assert _has(export(make_plan("llama3-70b", 64, Layout(cp=2, zero_stage=3)), "megatron").lost, "beside Megatron-FSDP")
    gb200 = make_plan("llama3-70b", 72, Layout(tp=4, zero_stage=3), cluster="gb200-nvl72",
                      training=TrainingSpec(seq_len=8192, global_batch=72))
    assert not _has(export(gb200, "megatron").lost, "beside Megatron-FSDP")


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


# ---- the frameworks' own parsers accept the files ---------------------------------------------------

CONSUMERS = Path(__file__).parent / "consumers"


def _load_harness() -> ModuleType:
    """tests/planner/consumers/harness.py, imported by path (test directories are no packages here)."""
    spec = importlib.util.spec_from_file_location("autopar_consumer_harness", CONSUMERS / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


harness = _load_harness()


def _consumer_results(fmt: str, tmp_path: Path, script: str | None = None, environment: str | None = None
                      ) -> dict[str, tuple[Plan, dict]]:
    """Write every fixture's `fmt` export and run tests/planner/consumers/<script> (check_<fmt>.py) on them."""
    plans = {name: build() for name, build in FIXTURES.items()}
    beside = {"deepspeed": "deepspeed"} if fmt == "accelerate" else None  # its DeepSpeed plugin reads ds_config.json
    manifest, refused = harness.write_exports(plans, fmt, tmp_path, export, beside)
    for name, why in refused.items():
        assert _export_or_refusal(plans[name], fmt)[1] == why
    results = harness.run_check(script or f"check_{fmt}.py", manifest, tmp_path, environment)
    rejected = {name: r["error"] for name, r in results.items() if not r["ok"]}
    assert not rejected, f"{fmt} rejected: {rejected}"
    return {name: (plans[name], r["values"]) for name, r in results.items()}


@pytest.mark.slow
def test_megatron_accepts_the_exports(tmp_path: Path) -> None:
    """Megatron-LM core_v0.16.1's parse_args + validate_args + core_transformer_config_from_args."""
    results = _consumer_results("megatron", tmp_path)
    for name, (plan, got) in results.items():
        lay, model = plan.best.layout, plan.inputs.model
        assert (got["tp"], got["pp"], got["vpp"], got["cp"]) == (lay.tp, lay.pp, lay.vpp, lay.cp), name
        assert got["dp"] == lay.dp and got["micro_batch"] == lay.micro_batch, name
        assert got["global_batch"] == plan.inputs.training.global_batch, name
        if model.is_moe:
            assert (got["ep"], got["etp"]) == (lay.ep, lay.etp_), name
            groups = (model.moe_router_groups or None, model.moe_router_group_topk or None)
            assert (got["router_groups"], got["router_group_topk"]) == groups, name
        assert got["rotary_base"] == int(model.rope_theta or 10000), name
        llama3_scaling = model.rope_scaling is not None and model.rope_scaling.rope_type == "llama3"
        assert got["use_rope_scaling"] == llama3_scaling, name
        fsdp = lay.zero_stage >= 2
        assert got["cuda_device_max_connections"] == (None if fsdp or (lay.tp == 1 and lay.cp == 1) else "1"), name
        assert got["config"] == ("MLATransformerConfig" if model.attention == "mla" else "TransformerConfig")
        if lay.vpp > 1:  # the rule forward_backward_pipelining_with_interleaving enforces, on the parsed group
            m, group = lay.grad_accum_, got["microbatch_group"]
            assert lay.pp <= group <= m and (m % group == 0 or m % group >= lay.pp), name
    assert any(got["microbatch_group"] != plan.best.layout.pp for plan, got in results.values())  # the 120-micro-batch case


@pytest.mark.slow
def test_deepspeed_accepts_the_exports(tmp_path: Path) -> None:
    """DeepSpeed 0.19.8's DeepSpeedConfig at the plan's world size, with the mpu the file's own
    `autopar.initialize` lines build (run as written on a fake process group)."""
    results = _consumer_results("deepspeed", tmp_path)
    for name, (plan, got) in results.items():
        lay = plan.best.layout
        assert got["release"] == "DeepSpeed 0.19.8", name
        assert got["world_size"] == plan.inputs.gpus // (lay.tp * lay.pp), name  # DeepSpeed's data-parallel size
        assert got["mpu"] == ("PipelineParallelGrid" if lay.pp > 1 else "deepspeed.utils.groups" if lay.tp > 1 else None), name
        assert got["train_batch_size"] == plan.inputs.training.global_batch, name
        assert got["zero_stage"] == (min(lay.zero_stage, 1) if lay.pp > 1 else lay.zero_stage), name
        assert got["offload_optimizer"] == lay.offload_optimizer, name
        assert got["pipeline_stages"] == (lay.pp if lay.pp > 1 else "auto"), name
        if lay.offload_device == "nvme":  # DeepSpeed's OffloadDeviceEnum prints as e.g. "OffloadDeviceEnum.nvme"
            assert got["offload_optimizer_device"].endswith("nvme") and got["offload_param_device"].endswith("nvme"), name
        if lay.zero_hpz_partition_size > 1:
            assert got["hpz"] == lay.zero_hpz_partition_size, name
        assert (got["qwz"], got["qgz"]) == (lay.zero_quantized_weights, lay.zero_quantized_gradients), name
    assert {got["mpu"] for _, got in results.values()} == {None, "deepspeed.utils.groups", "PipelineParallelGrid"}


@pytest.mark.slow
def test_deepspeed_initialize_runs_the_tensor_parallel_export_on_gloo_ranks(tmp_path: Path) -> None:
    """deepspeed.initialize for real: the AutoTP plan's ds_config.json and its initialize lines as
    written, on 8 gloo ranks of this machine with a tiny Llama, then one optimizer step. Without the
    mpu the file names, DeepSpeed 0.19.8 refuses it: 32 != 1 * 8 * 8."""
    plan = FIXTURES["llama3-8b-deepspeed-tp"]()
    result = export(plan, "deepspeed")
    (tmp_path / result.filename).write_text(result.text)
    proc = subprocess.run(
        [sys.executable, str(CONSUMERS / "run_deepspeed_ranks.py"), str(tmp_path / result.filename), str(plan.inputs.gpus)],
        capture_output=True, text=True, timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["ok"], got["error"]
    values = got["values"]
    assert values["train_batch_size"] == plan.inputs.training.global_batch == 32
    assert (values["dp_world_size"], values["autotp_size"], values["grad_accum"]) == (4, 2, 8)
    assert values["global_steps"] == 1  # every accumulation micro-step ran, and the optimizer stepped


@pytest.mark.slow
def test_accelerate_accepts_the_exports(tmp_path: Path) -> None:
    """Accelerate 1.15.0's ClusterConfig, launcher validation and environment, ParallelismConfig and
    FSDP plugin; for DeepSpeed files, DeepSpeedConfig on what Accelerate hands deepspeed.initialize.
    The batch train.py runs (the file's DataLoader batch size and accumulation over the data-parallel
    ranks Accelerate forms) is the plan's global batch."""
    deepspeed = set()
    for name, (plan, got) in _consumer_results("accelerate", tmp_path).items():
        lay, tr = plan.best.layout, plan.inputs.training
        assert got["num_processes"] == plan.inputs.gpus and got["main_process_ip"] is None, name
        assert got["global_batch"] == tr.global_batch, (name, got["micro_batch"], got["gradient_accumulation"])
        if lay.framework != "deepspeed":
            assert got["plugin"] == "fsdp" and got["parallel_total"] == plan.inputs.gpus, name
            assert (got["tp"], got["cp"], got["fsdp_version"]) == (lay.tp, lay.cp, 2), name
            assert got["mixed_precision"] == tr.precision, name
            continue
        deepspeed.add(name)
        ds = json.loads(export(plan, "deepspeed").text)  # what the plan's own ds_config.json says
        assert got["plugin"] == "deepspeed" and got["zero_stage"] == lay.zero_stage, name
        assert got["mixed_precision"] == ("bf16" if tr.precision == "fp8" else tr.precision), name
        device = lay.offload_device if lay.zero_stage == 3 else "cpu"
        assert got["offload_optimizer_device"] == (device if lay.offload_optimizer else "none"), name
        assert got["offload_param_device"] == (device if lay.offload_params else "none"), name
        assert got["zero3_init_flag"] == (lay.zero_stage == 3 and lay.zero_init), name
        assert got["ds_world_size"] == plan.inputs.gpus, name  # Accelerate hands DeepSpeed no mpu: every rank
        assert got["ds_train_batch_size"] == got["micro_batch"] * got["gradient_accumulation"] * plan.inputs.gpus, name
        if lay.pp == 1 and lay.tp == 1:  # the plan's ds_config.json: every ZeRO / ZeRO++ key of it
            assert got["config_file"] == "ds_config.json", name
            assert got["zero_optimization"] == ds["zero_optimization"], name
            assert got["gradient_accumulation_steps"] == ds["gradient_accumulation_steps"], name
        else:  # every GPU a data-parallel rank: the plan's global batch over all of them
            assert got["config_file"] is None and got["tensor_parallel"] is None, name
    assert deepspeed == {"llama-65b-qlora", "llama3-70b-zero-infinity", "llama3-8b-deepspeed-pipe", "llama3-8b-deepspeed-tp"}


@pytest.mark.slow
def test_torchtitan_accepts_the_exports(tmp_path: Path) -> None:
    """torchtitan 0.2.2's ConfigManager (--job.config_file) and ParallelDims; the model flavor is
    one of torchtitan's own where torchtitan has the model."""
    results = _consumer_results("torchtitan", tmp_path)
    for name, (plan, got) in results.items():
        lay, model = plan.best.layout, plan.inputs.model
        assert (got["tp"], got["pp"], got["cp"]) == (lay.tp, lay.pp, lay.cp), name
        assert got["dp_replicate"] * got["dp_shard"] == lay.dp, name
        assert got["model_parts"] == (lay.pp * lay.vpp if lay.pp > 1 else 0), name
        assert got["description"].startswith(f"autopar: {model.name} on {plan.inputs.gpus} x "), name
        if model.family in ("llama", "deepseek_v3") and flavor_of(model)[1] is not None:
            assert got["known_model"] and got["known_flavor"], (name, got["flavor"])
        elif model.family not in ("llama", "deepseek_v3"):
            assert not got["known_model"] and _has(export(plan, "torchtitan").lost, f"model family {model.family}")
        else:  # LLaMA-65B: llama family, no torchtitan flavor of its shape (Llama 3's are GQA with 128,256 tokens)
            assert not got["known_flavor"] and _has(export(plan, "torchtitan").lost, "no llama3 flavor")
    flavors = {n: v["flavor"] for n, (_, v) in results.items()}
    assert flavors["llama3-70b"] == "70B" and flavors["llama3-8b-fsdp"] == "8B" and flavors["llama3-405b-split"] == "405B"


@pytest.mark.slow
def test_torchtitan_03_loads_the_config_modules(tmp_path: Path) -> None:
    """torchtitan 0.3.0's ConfigManager (--module autopar_torchtitan --config autopar, the file's own
    directory on the path) and ParallelDims, torchtitan 0.3.0 installed apart from 0.2.2
    (scripts/test.sh: .venv/torchtitan-0.3); the FP8 plans' converters reach the model config."""
    assert (harness.torchtitan_03_path() / "torchtitan").is_dir(), (
        f"torchtitan 0.3.0 is not installed at {harness.torchtitan_03_path()}: run scripts/test.sh, which installs it there")
    results = _consumer_results("torchtitan-0.3", tmp_path, "check_torchtitan_03.py", "torchtitan_03")
    for name, (plan, got) in results.items():
        lay, tr = plan.best.layout, plan.inputs.training
        assert got["release"] == "0.3.0", name
        assert (got["tp"], got["pp"], got["cp"], got["ep"]) == (lay.tp, lay.pp, lay.cp, lay.ep), name
        assert got["dp_replicate"] * got["dp_shard"] == lay.dp, name
        assert got["layers"] == plan.inputs.model.num_layers and got["global_batch"] == tr.global_batch, name
        assert got["model_parts"] == (lay.pp * lay.vpp if lay.pp > 1 else 0), name
        assert got["float8_linear"] == (tr.precision == "fp8"), name
        assert got["float8_experts"] == (tr.precision == "fp8" and plan.inputs.model.is_moe), name
    assert "deepseek-v3-h800-fp8" in results and "llama-65b-qlora" not in results  # no torchtitan model of LLaMA-65B


def _run_launch_script(text: str, cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run an exported launch.sh with a `torchrun` on PATH that records its arguments (one per
    line) instead of starting processes; returns the process and the recorded arguments."""
    bin_dir = cwd / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$TORCHRUN_ARGS"\nenv | grep ^AUTOPAR_ | sort > "$TORCHRUN_ENV"\n')
    fake.chmod(0o755)
    (cwd / "launch.sh").write_text(text)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1", "HOME": str(cwd),
        "TORCHRUN_ARGS": str(cwd / "bin" / "args.txt"), "TORCHRUN_ENV": str(cwd / "bin" / "env.txt"),
    }
    proc = subprocess.run(["bash", "launch.sh", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    recorded = (cwd / "bin" / "args.txt").read_text().splitlines() if (cwd / "bin" / "args.txt").exists() else []
    return proc, recorded


def test_torchrun_accepts_the_launch_lines(tmp_path: Path) -> None:
    """The launch script, run by bash, calls torchrun with arguments torchrun's own parser
    (`torch.distributed.run`) turns into the plan's launch config; it writes the plan it embeds
    and exports the plan's degrees."""
    import torch.distributed.run as torchrun

    from planner.plan import Plan as PlanModel

    plan = FIXTURES["llama3-70b"]()
    text = export(plan, "torchrun").text
    proc, argv = _run_launch_script(text, tmp_path, "train.py", "--lr", "3e-4")
    assert proc.returncode == 0, proc.stderr
    assert argv[-3:] == ["train.py", "--lr", "3e-4"]
    config, cmd, cmd_args = torchrun.config_from_args(torchrun.parse_args(argv))
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (8, 8, 8)
    assert config.rdzv_backend == "c10d" and config.rdzv_endpoint == "127.0.0.1:29500"
    assert cmd_args[-3:] == ["train.py", "--lr", "3e-4"]
    written = PlanModel.model_validate(json.loads((tmp_path / "plan.json").read_text()))
    assert written.best is not None and written.best.layout == plan.best.layout
    env = dict(line.split("=", 1) for line in (tmp_path / "bin" / "env.txt").read_text().splitlines())
    assert env["AUTOPAR_TP"] == "8" and env["AUTOPAR_PP"] == "4" and env["AUTOPAR_GLOBAL_BATCH"] == "512"

    proc, argv = _run_launch_script(text, tmp_path, "--autopar-runtime", "--steps", "5")
    assert proc.returncode == 0, proc.stderr
    config, cmd, cmd_args = torchrun.config_from_args(torchrun.parse_args(argv))
    assert argv[-5:] == ["-m", "runtime.launch", "plan.json", "--steps", "5"]

    proc, argv = _run_launch_script(text, tmp_path)
    assert proc.returncode == 2 and "usage: launch.sh" in proc.stderr


# ---- names are data: every exporter quotes or escapes for its own syntax ---------------------------

MARKER = "pwned"
PAYLOADS = [
    f"x\ntouch {MARKER}\n",
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f"'; touch {MARKER}; '",
    f'"; touch {MARKER}; "',
    f"\\\ntouch {MARKER}",
    f"a\rtouch {MARKER}",
    f"\u2028touch {MARKER}\u2029\x85",
    "\nevil_key: 1\nnum_processes: 1",
    '"\n[evil]\nx = 1\n',
    "]]\n[[x]]\n#",
    "${IFS}$((1+1))!${PATH}*?[a]{b,c}~|&;<>",
    "AUTOPAR_PLAN_JSON",
    "\ud800 lone surrogate \x00 nul \x7f del \ufeff bom",
]
_name = st.one_of(
    st.sampled_from(PAYLOADS),
    st.lists(
        st.sampled_from(list("\n\r\t\x0b\x0c\x85\u2028\u2029 '\"`$(){}[]|&;<>*?!#~=:,-\\\x00\x7f") + [f"touch {MARKER}"]),
        max_size=12,
    ).map("".join),
    st.text(max_size=30),
).map(lambda s: s or "x")


def _renamed(model: str, cluster: str, gpu: str, family: str | None = None) -> Plan:
    plan = make_plan("llama3-8b", 16, Layout(tp=2, pp=2, zero_stage=1), training=TrainingSpec(seq_len=4096, global_batch=32))
    inp = plan.inputs
    spec = inp.model.model_copy(update={"name": model, **({"family": family} if family else {})})
    clus = inp.cluster.model_copy(update={"name": cluster, "gpu": inp.cluster.gpu.model_copy(update={"name": gpu})})
    plan.inputs = inp.model_copy(update={"model": spec, "cluster": clus})
    return plan


def _no_marker(root: Path) -> None:
    assert not any(MARKER in p.name for p in root.rglob("*")), "an injected command ran"


def _megatron_array(path: Path, cwd: Path) -> list[str]:
    out = subprocess.run(
        ["bash", "-c", 'source "$1" && printf "%s\\0" "${MEGATRON_ARGS[@]}"', "bash", str(path)],
        cwd=cwd, env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)}, capture_output=True, text=True, check=True,
    ).stdout
    return out.split("\0")[:-1]


_BENIGN = _renamed("llama3-8b", "dgx-h100", "H100-80GB")


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=_name, cluster=_name, gpu=_name)
def test_names_are_data_in_every_export(model: str, cluster: str, gpu: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Names with shell, YAML and TOML metacharacters, line breaks of every kind, quotes, `$()`
    and backticks: the shell scripts pass `bash -n` and, run by bash, execute no injected command
    and carry the same arguments as with plain names; the YAML, TOML and JSON parse to the same
    documents, with the names (where a file carries them as data) given back exactly."""
    work = tmp_path_factory.mktemp("inject")
    plan = _renamed(model, cluster, gpu)
    benign = {fmt: export(_BENIGN, fmt) for fmt in formats()}
    got = {fmt: export(plan, fmt) for fmt in formats()}
    for fmt in ("torchrun", "megatron"):
        subprocess.run(["bash", "-n"], input=got[fmt].text, text=True, check=True)

    # megatron: sourcing runs the whole file; the array is the one plain names give
    (work / "m.sh").write_text(got["megatron"].text)
    (work / "b.sh").write_text(benign["megatron"].text)
    assert _megatron_array(work / "m.sh", work) == _megatron_array(work / "b.sh", work)
    _no_marker(work)

    # torchrun: the script runs end to end; the plan it writes gives the names back
    from planner.plan import Plan as PlanModel

    proc, argv = _run_launch_script(got["torchrun"].text, work, "train.py")
    assert proc.returncode == 0, proc.stderr
    plain = _run_launch_script(benign["torchrun"].text, work / "bin", "train.py")[1]
    rdzv = argv.index("--rdzv-id") + 1  # a hash of the job, names included
    assert argv[:rdzv] + argv[rdzv + 1 :] == plain[:rdzv] + plain[rdzv + 1 :]
    written = PlanModel.model_validate(json.loads((work / "plan.json").read_text()))  # as runtime.spec reads it
    assert (written.inputs.model.name, written.inputs.cluster.name, written.inputs.cluster.gpu.name) == (model, cluster, gpu)
    _no_marker(work)

    # YAML: the same document (no injected key, no overridden value)
    assert yaml.safe_load(got["accelerate"].text) == yaml.safe_load(benign["accelerate"].text)
    # TOML: the same document but the description, which holds the names exactly
    doc, ref = tomllib.loads(got["torchtitan"].text), tomllib.loads(benign["torchtitan"].text)
    assert doc.pop("job") == {"description": f"autopar: {model} on 16 x {gpu} ({cluster})"}
    ref.pop("job")
    assert doc == ref
    # JSON: the same config; the notes give the names back exactly
    cfg, ref = json.loads(got["deepspeed"].text), json.loads(benign["deepspeed"].text)
    assert cfg.pop("autopar")["summary"][0].startswith(f"{model} on 16 x {gpu} ({cluster}): ")
    ref.pop("autopar")
    assert cfg == ref


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=_name)
def test_family_is_data_too(family: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The architecture family (a config.json's model_type) reaches lost notes and torchtitan's
    [model] name: still data."""
    work = tmp_path_factory.mktemp("family")
    plan = _renamed("m", "c", "g", family=family)
    for fmt in ("torchrun", "megatron"):
        text = export(plan, fmt).text
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        (work / f"{fmt}.sh").write_text(text)
    _megatron_array(work / "megatron.sh", work)
    _no_marker(work)
    doc = tomllib.loads(export(plan, "torchtitan").text)
    assert doc["model"]["name"] == {"llama": "llama3", "qwen3": "qwen3", "qwen3_moe": "qwen3", "gpt_oss": "gpt_oss",
                                    "deepseek_v3": "deepseek_v3", "deepseek_v2": "deepseek_v3"}.get(family, family)
    assert set(yaml.safe_load(export(plan, "accelerate").text)) == set(yaml.safe_load(export(_BENIGN, "accelerate").text))
    json.loads(export(plan, "deepspeed").text)


def test_one_line_escapes_every_line_break() -> None:
    from planner.exporters.common import comment_block, one_line

    for brk in ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"):
        line = one_line(f"a{brk}b")
        assert len(line.splitlines()) == 1 and line.isprintable(), repr(brk)
    assert one_line("a\\nb\nc") == "a\\\\nb\\nc"  # backslashes doubled: escapes stay unambiguous
    assert comment_block(["x\ny"]) == "# x\\ny"


def test_lora_and_qlora_exports_carry_the_peft_configuration() -> None:
    """DeepSpeed's JSON carries PEFT's LoraConfig and transformers' BitsAndBytesConfig arguments
    (applied by the training script), Accelerate's YAML the same as train.py lines; targets that
    train every weight say so."""
    ds = json.loads(export(FIXTURES["llama-65b-qlora"](), "deepspeed").text)
    peft = ds["autopar"]["peft"]
    assert peft["lora_config"] == {
        "r": 64, "lora_alpha": 16.0, "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    }
    assert peft["bitsandbytes_config"]["bnb_4bit_use_double_quant"] is True
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    lora_plan = FIXTURES["llama3-8b-lora"]()
    acc = export(lora_plan, "accelerate").text
    assert "peft.LoraConfig(r=16, lora_alpha=32.0" in acc and "target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj']" in acc
    assert "BitsAndBytesConfig" not in acc
    for fmt, who in (("torchtitan", "torchtitan trains every weight"), ("megatron", "pretrain_gpt.py trains every weight")):
        assert any(who in line for line in export(lora_plan, fmt).lost)
    full = export(FIXTURES["llama3-8b-fsdp"](), "deepspeed")
    assert "peft" not in json.loads(full.text)["autopar"]


def test_zero_infinity_and_zeropp_reach_the_deepspeed_config() -> None:
    """NVMe offload with the buffer sizes the memory model prices, and ZeRO++'s three knobs, in
    DeepSpeed's own keys; the frameworks without them say so."""
    from cost_models.memory import (
        NVME_PARAM_BUFFER_COUNT,
        NVME_PARAM_BUFFER_ELEMENTS,
        NVME_SUB_GROUP_ELEMENTS,
    )

    plan = FIXTURES["llama3-70b-zero-infinity"]()
    zero = json.loads(export(plan, "deepspeed").text)["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "nvme" and zero["offload_param"]["device"] == "nvme"
    assert zero["offload_param"]["buffer_count"] == NVME_PARAM_BUFFER_COUNT
    assert zero["offload_param"]["buffer_size"] == NVME_PARAM_BUFFER_ELEMENTS
    assert zero["sub_group_size"] == NVME_SUB_GROUP_ELEMENTS
    assert zero["zero_hpz_partition_size"] == 8
    assert zero["zero_quantized_weights"] is True and zero["zero_quantized_gradients"] is True
    for fmt in ("torchtitan", "megatron"):
        lost = " ".join(export(plan, fmt).lost)
        assert "NVMe offload (ZeRO-Infinity)" in lost and "ZeRO++ hpZ (zero_hpz_partition_size=8)" in lost, fmt
    # Accelerate's DeepSpeed plugin runs that very ds_config.json: nothing of it is lost
    accelerate = export(plan, "accelerate")
    assert yaml.safe_load(accelerate.text)["deepspeed_config"]["deepspeed_config_file"] == "ds_config.json"
    assert not _has(accelerate.lost, "ZeRO++") and not _has(accelerate.lost, "ZeRO-Infinity")


def test_v_shape_schedules_reach_torchtitan() -> None:
    """ZB-V and DualPipeV are torchtitan schedule names; DualPipeV with EP asks for the EP overlap
    the step-time model prices; Megatron and DeepSpeed say they cannot run them."""
    plan = FIXTURES["mixtral-8x7b-dualpipev"]()
    cfg = tomllib.loads(export(plan, "torchtitan").text)
    assert cfg["parallelism"]["pipeline_parallel_schedule"] == "DualPipeV"
    assert cfg["parallelism"]["pipeline_parallel_expert_parallel_overlap"] is True
    assert len(cfg["parallelism"]["module_fqns_per_model_part"]) == 8  # pp x 2 chunks, in model order
    assert _has(export(plan, "megatron").lost, "V-shape")
    assert _has(export(plan, "deepspeed").lost, "DualPipeV")


def test_torchtitan_compiles_what_was_priced_fused_and_not_what_was_priced_eager() -> None:
    """A plan priced with fused norms, rotary and activations (`Layout.elementwise_kernels`) is
    exported compiled; one priced eager runs eagerly, unless async TP needs the compiler (said)."""
    plan = FIXTURES["llama3-8b-fsdp"]()
    assert tomllib.loads(export(plan, "torchtitan").text)["compile"]["enable"] is True
    plan.best.layout = plan.best.layout.model_copy(update={"elementwise_kernels": "eager"})
    result = export(plan, "torchtitan")
    assert tomllib.loads(result.text)["compile"] == {"enable": False} and result.lost == []
    assert _has(export(plan, "megatron").lost, "eager elementwise kernels")
    assert not _has(export(plan, "accelerate").lost, "fused elementwise kernels")
    plan.best.layout = plan.best.layout.model_copy(update={"elementwise_kernels": "fused"})
    assert _has(export(plan, "accelerate").lost, "fused elementwise kernels")


def test_targets_without_multi_token_prediction_say_so() -> None:
    """A plan that priced DeepSeek-V3's MTP module, exported where it is not trained, says the run
    will differ from the price; a model without MTP gets no such note."""
    plan = FIXTURES["deepseek-v3"]()
    for target in ("torchtitan", "deepspeed", "accelerate"):
        assert "multi-token prediction (1 module of deepseek-v3)" in export(plan, target).text
    assert "multi-token prediction" not in export(FIXTURES["llama3-70b"](), "torchtitan").text


def test_one_gpu_plans_launch_one_process() -> None:
    """A 1-GPU plan on an 8-GPU node launches one process (it launched 8: --nproc-per-node 8)."""
    plan = FIXTURES["llama-65b-qlora"]()
    for fmt in ("torchrun", "megatron", "torchtitan"):
        text = export(plan, fmt).text
        assert "--nproc-per-node 1" in text and "--nproc-per-node 8" not in text, fmt
    assert yaml.safe_load(export(plan, "accelerate").text)["num_processes"] == 1


def test_megatron_writes_group_limited_routing_and_says_what_it_drops() -> None:
    """DeepSeek-V3's group-limited routing is Megatron-Core's --moe-router-num-groups / --moe-router-group-topk
    (it was called inexpressible); parameter offload, which Megatron-Core lacks, is named; the FP8 recipe
    the file runs is named."""
    args = _megatron_args(export(FIXTURES["deepseek-v3"](), "megatron").text)
    assert args["--moe-router-num-groups"] == ["8"] and args["--moe-router-group-topk"] == ["4"]
    offload = export(FIXTURES["llama3-70b-zero-infinity"](), "megatron").lost
    assert _has(offload, "parameter offload", "weight shards stay on the GPU")
    fp8 = export(FIXTURES["deepseek-v3-h800-fp8"](), "megatron")
    assert _megatron_args(fp8.text)["--fp8-recipe"] == ["delayed"]
    assert _has(fp8.lost, "FP8 scaling recipe: this file runs Megatron-Core's delayed scaling")
    paper = _megatron_args(export(FIXTURES["deepseek-v3-paper"](), "megatron").text)
    assert paper["--fp8-recipe"] == ["blockwise"]  # moe_act / layernorm recompute: refused under delayed scaling


def test_torchtitan_fp8_experts_are_converted_where_the_release_can() -> None:
    """0.2's float8 grouped-GEMM converter refuses pipeline parallelism: DeepSeek-V3 on PP16 keeps bf16 experts in the
    TOML and says so; without a pipeline the experts are converted; 0.3's module converts them either way."""
    pp = export(FIXTURES["deepseek-v3-h800-fp8"](), "torchtitan")
    assert tomllib.loads(pp.text)["model"]["converters"] == ["quantize.linear.float8"]
    assert _has(pp.lost, "FP8 routed experts", "refuses pipeline parallelism")
    flat = make_plan("deepseek-v3", 2048, Layout(ep=64), cluster="dgx-h800",
                     training=TrainingSpec(seq_len=4096, global_batch=2048, precision="fp8"))
    doc = tomllib.loads(export(flat, "torchtitan").text)
    assert doc["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert doc["quantize"]["grouped_mm"]["float8"]["fqns"] == ["experts"]
    module = export(FIXTURES["deepseek-v3-h800-fp8"](), "torchtitan-0.3").text
    assert "Float8GroupedExpertsConverter.Config(" in module and "disable_cuda_graphs = True" in module
    assert "torchtitan 0.3 reads no TOML" in pp.text and "--job.config_file torchtitan.toml" in pp.text


def test_deepspeed_files_name_the_release_and_how_to_initialize() -> None:
    cfg = json.loads(export(FIXTURES["llama3-8b-deepspeed-tp"](), "deepspeed").text)
    assert cfg["autopar"]["release"] == "DeepSpeed 0.19.8"
    assert cfg["autopar"]["initialize"][-2].startswith("groups._init_tp_mesh_device(tensor_model_parallel_size=2)")
    assert cfg["optimizer"] == {"type": "AdamW"}  # the optimizer the plan priced; its learning rate is the script's
    pipe = json.loads(export(FIXTURES["llama3-8b-deepspeed-pipe"](), "deepspeed").text)
    assert "tensor_parallel" not in pipe and _has(pipe["autopar"]["not_expressible"], "AutoTP does not shard a PipelineModule")
