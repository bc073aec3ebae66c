"""What every exporter reads from a Plan: the chosen layout, resolved, with the model, training,
cluster and stage partition it was planned for, plus small formatting helpers.

Names are data. A model, cluster or GPU name comes from the user and may hold any character
(newlines, quotes, `$()`, backticks, YAML or TOML syntax). Exporters never splice such text into
syntax: values go through the file format's own writer (`shlex.quote`, a YAML dumper, a TOML
writer, `json.dumps`), and text in comments goes through `one_line`, which escapes every
character that could end a comment line in shell, YAML or TOML."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from cluster_specs.spec import ClusterSpec
from cost_models.compute import trained_mtp_layers
from cost_models.layout import Layout
from cost_models.stages import StagePartition, even_partition
from model_specs.spec import ModelSpec, TrainingSpec
from planner.explain import counted
from planner.plan import Candidate, Plan

RDZV_PORT = 29500
LAUNCH_MODULE = "runtime.launch"
PLAN_FILE = "plan.json"


SCHEDULE_NAMES = {
    "gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "interleaved 1F1B", "zero_bubble": "zero-bubble (ZB1P)",
    "zbv": "ZB-V", "dualpipev": "DualPipeV", "looped_bfs": "looped BFS",
}
"""`Layout.schedule` as the lost notes name it."""


@dataclass(frozen=True)
class ExportResult:
    """One exported file: its text, a suggested file name, and what the target cannot express
    (each entry a sentence naming the planned feature and what the file does instead)."""

    text: str
    filename: str
    lost: list[str]
    media_type: str = "text/plain"


class ExportError(ValueError):
    """The plan cannot be exported (nothing fits, or an unknown format)."""


@dataclass(frozen=True)
class Job:
    """The plan's best candidate with everything an exporter needs."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    gpus: int
    layout: Layout  # resolved
    chunk_layers: tuple[int, ...]  # layers per chunk, pp x vpp chunks in model order
    estimate: dict[str, Any]
    nodes: int
    gpus_per_node: int
    plan_json: str = "{}"  # the Plan with this candidate as its best (what `runtime.launch` reads)

    # ---- shorthands ---------------------------------------------------------------------------
    @property
    def lay(self) -> Layout:
        return self.layout

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def vpp(self) -> int:
        return self.layout.vpp

    @property
    def dp(self) -> int:
        return self.layout.dp_

    @property
    def dp_shard(self) -> int:
        return self.layout.dp_shard_

    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard

    @property
    def mtp_layers(self) -> int:
        """Multi-token-prediction modules the plan priced (`compute.trained_mtp_layers`)."""
        return trained_mtp_layers(self.model, self.training.frozen_base)

    @property
    def partition(self) -> StagePartition:
        return StagePartition.explicit(self.chunk_layers, self.layout)

    @property
    def even(self) -> bool:
        """Every chunk holds the same number of layers."""
        return len(set(self.chunk_layers)) == 1

    @property
    def default_cut(self) -> bool:
        """The cut `cost_models.stages.even_partition` makes (remainder in the middle)."""
        return self.chunk_layers == even_partition(self.model.num_layers, self.pp * self.vpp)

    @property
    def full_recompute_all(self) -> bool:
        return self.layout.recompute == "full" and self.layout.recompute_layers is None

    @property
    def partial_recompute(self) -> bool:
        return self.layout.recompute == "full" and self.layout.recompute_layers is not None

    @property
    def nodes_even(self) -> bool:
        return self.gpus == self.nodes * self.gpus_per_node


def job_of(plan: Plan, candidate: Candidate | None = None) -> Job:
    """The exporters' view of `candidate` (default: the plan's best). Raises `ExportError` when
    the plan found no feasible layout."""
    cand = candidate or plan.best
    if cand is None:
        raise ExportError("the plan has no feasible layout to export (see its rejections and closest miss)")
    inp = plan.inputs
    lay = cand.layout.resolved(inp.gpus, inp.training)
    chunks = tuple(cand.partition) or even_partition(inp.model.num_layers, lay.pp * lay.vpp)
    if len(chunks) != lay.pp * lay.vpp or sum(chunks) != inp.model.num_layers:
        raise ExportError(
            f"partition {list(chunks)} does not cut {inp.model.num_layers} layers into pp x vpp = "
            f"{lay.pp} x {lay.vpp} chunks"
        )
    # processes per node: the cluster's GPUs per node, or all the job's GPUs when it fills less than one
    # node (the placement records the node's size: a 1-GPU plan on an 8-GPU node launches 1 process)
    node_size = cand.placement.gpus_per_node if cand.placement is not None else inp.cluster.gpus_per_node
    per_node = min(node_size, inp.gpus)
    nodes = math.ceil(inp.gpus / per_node)
    chosen = plan if cand is plan.best else plan.model_copy(update={"best": cand})
    return Job(
        inp.model, inp.training, inp.cluster, inp.gpus, lay, chunks, cand.estimate, nodes, per_node,
        # ASCII JSON on one line: every non-ASCII and control character (lone surrogates too) escaped
        json.dumps(chosen.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":")),
    )


# ---- text helpers ---------------------------------------------------------------------------------


def summary_lines(job: Job) -> list[str]:
    """A few plain sentences describing the job (for comment headers)."""
    lay = job.lay
    dims = [f"dp={job.dp}"]
    if job.dp_shard != job.dp:
        dims.append(f"(shard {job.dp_shard} x replicate {job.dp_replicate})")
    dims += [f"tp={lay.tp}", f"pp={lay.pp}"]
    if lay.vpp > 1:
        dims.append(f"vpp={lay.vpp}")
    if lay.cp > 1:
        dims.append(f"cp={lay.cp}")
    if lay.ep > 1:
        dims.append(f"ep={lay.ep} etp={lay.etp_}")
    knobs = [f"ZeRO-{lay.zero_stage}", f"micro-batch {lay.micro_batch} x {lay.grad_accum_} accumulation"]
    if lay.sp_:
        knobs.append("sequence parallel")
    if lay.recompute != "none":
        what: str = lay.recompute
        if job.partial_recompute:
            what += f" ({lay.recompute_layers} layers per stage)"
        knobs.append(f"recompute {what}")
    if lay.pp > 1:
        knobs.append(f"{lay.schedule_} schedule")
    if lay.offload_optimizer:
        knobs.append("optimizer offloaded to CPU")
    lines = [
        f"{job.model.name} on {job.gpus} x {job.cluster.gpu.name} ({job.cluster.name}): "
        f"{counted(job.nodes, 'node')} x {counted(job.gpus_per_node, 'GPU')}",
        "layout: " + " ".join(dims),
        "knobs: " + ", ".join(knobs),
        f"training: seq_len {job.training.seq_len}, global batch {job.training.global_batch} sequences, "
        f"{job.training.precision}",
    ]
    if lay.pp > 1:
        lines.append("layers per stage: " + " | ".join(str(n) for n in job.chunk_layers))
    est = job.estimate or {}
    if "step_s" in est:
        parts = [f"step {float(est['step_s']):.3f} s"]
        if "tokens_per_s" in est:
            parts.append(f"{float(est['tokens_per_s']):,.0f} tokens/s")
        if "mfu" in est:
            parts.append(f"MFU {100 * float(est['mfu']):.1f}%")
        peak = (est.get("memory") or {}).get("peak_bytes")
        if peak is not None:
            parts.append(f"peak {int(peak) / 2**30:.1f} GiB per GPU")
        lines.append("estimate: " + ", ".join(parts))
    return lines


def one_line(text: str) -> str:
    """`text` as one printable line: every character that is not printable (newlines, carriage
    returns, NEL, the Unicode line and paragraph separators, other control and format
    characters, lone surrogates) is written as its Python escape (`\\n`, `\\x85`, `\\u2028`), and
    backslashes are doubled so the escapes are unambiguous. Safe inside a `#` comment of shell,
    YAML and TOML, whose comments end only at a line break."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c.isprintable():
            out.append(c)
        else:
            out.append(c.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return "".join(out)


def comment_block(lines: list[str], prefix: str = "# ") -> str:
    """`#` comment lines; each line passes through `one_line`, so user text cannot end a comment."""
    return "\n".join(f"{prefix}{one_line(line)}".rstrip() for line in lines)


def notes_lines(target: str, lost: list[str]) -> list[str]:
    """The file's own list of what the plan priced and `target` cannot express (empty: none)."""
    if not lost:
        return [f"Everything the plan priced is expressed in this {target} file."]
    return [f"Not expressible in {target} (the plan priced it; this file does what each line says):"] + [
        f"- {line}" for line in lost
    ]


def framework_note(job: Job, framework: str, target: str) -> list[str]:
    """A note when the plan was priced for another execution framework than the file's target
    (`Layout.framework`: the overlap and kernel efficiencies the step time assumed)."""
    if job.lay.framework == framework:
        return []
    return [
        f"priced for framework '{job.lay.framework}': the step time assumed that framework's overlap and "
        f"kernels; re-plan with --framework {framework} for {target}'s own"
    ]


def deepspeed_only_notes(job: Job, target: str) -> list[str]:
    """What of a DeepSpeed-priced plan no other framework runs: ZeRO-Infinity's NVMe tier and
    ZeRO++ (hpZ, qwZ, qgZ)."""
    lay, out = job.lay, []
    if lay.offload_device == "nvme":
        out.append(f"NVMe offload (ZeRO-Infinity): {target} offloads to CPU memory only; the states priced on "
                   "NVMe need the node's host RAM instead")
    zpp = [name for name, on in (
        (f"hpZ (zero_hpz_partition_size={lay.zero_hpz_partition_size})", lay.zero_hpz_partition_size > 1),
        ("qwZ (int8 weight all-gathers)", lay.zero_quantized_weights),
        ("qgZ (int4 gradient reduce-scatters)", lay.zero_quantized_gradients),
    ) if on]
    if zpp:
        out.append(f"ZeRO++ {', '.join(zpp)}: DeepSpeed's; {target} gathers and reduces in full precision over the "
                   "whole sharding group")
    return out


def nodes_note(job: Job) -> list[str]:
    if job.nodes_even:
        return []
    return [
        f"{job.gpus} GPUs do not fill {job.nodes} nodes of {job.gpus_per_node}: the launcher starts "
        f"{job.gpus_per_node} processes per node; run the last node with fewer or size the job to whole nodes"
    ]


def peft_config(job: Job) -> dict[str, Any] | None:
    """The training method as the Hugging Face stack spells it (None for full training):
    `lora_config` holds PEFT `LoraConfig` arguments (the adapted modules this model has, no dropout:
    what the plan priced), `bitsandbytes_config` the transformers `BitsAndBytesConfig` arguments of a
    QLoRA base (NF4 with double quantization or int8; `bnb_4bit_quant_storage` in the compute dtype
    so FSDP / ZeRO-3 can shard the packed weights)."""
    from model_specs.params import adapted_names

    tr = job.training
    if not tr.frozen_base:
        return None
    out: dict[str, Any] = {
        "lora_config": {
            "r": tr.lora_rank_,
            "lora_alpha": tr.lora_alpha_,
            "lora_dropout": 0.0,
            "bias": "none",
            "task_type": "CAUSAL_LM",
            "target_modules": list(adapted_names(job.model, tr.lora_modules)),
        }
    }
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(tr.precision, "bfloat16")
    if tr.quant_format_ == "int8":
        out["bitsandbytes_config"] = {"load_in_8bit": True}
    elif tr.quant_format_ is not None:
        out["bitsandbytes_config"] = {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": tr.quant_format_ == "nf4_double",
            "bnb_4bit_compute_dtype": dtype,
            "bnb_4bit_quant_storage": dtype,
        }
    return out


def mtp_note(job: Job, target: str) -> list[str]:
    """What a target without multi-token prediction loses of a plan that priced MTP modules
    (`ModelSpec.mtp_layers`, beside the LM head)."""
    n = job.mtp_layers
    if not n:
        return []
    return [
        f"multi-token prediction ({counted(n, 'module')} of {job.model.name}): {target} trains without "
        f"{'it' if n == 1 else 'them'}; the plan priced {'its' if n == 1 else 'their'} block, projection and extra "
        "output-head pass on the head rank, so this run is faster"
    ]


def triton_attention_note(job: Job, target: str, kernel: str) -> list[str]:
    """What a target loses of a plan priced with FlashAttention in Triton (`Layout.attention_kernel`
    "triton_flash", llm-foundry's `attn_impl: triton`): it attends with `kernel` instead, at least twice
    as fast as the plan priced the attention (`cost_models.kernels.attention.TRITON_FLASH_SPEED`)."""
    if job.lay.attention_kernel_ != "triton_flash":
        return []
    return [
        f"FlashAttention in Triton (llm-foundry's attn_impl triton): {target} attends with {kernel}, at least "
        "twice as fast as the plan priced the attention; re-plan with that kernel for its price"
    ]


def method_note(job: Job, target: str, instead: str) -> list[str]:
    """What a target that trains every weight loses of a LoRA / QLoRA plan, and where to run it."""
    tr = job.training
    if not tr.frozen_base:
        return []
    return [
        f"training method {tr.method} (frozen base, rank-{tr.lora_rank_} adapters): {target} trains every weight; "
        f"this file runs full training, which needs the gradients and optimizer states of the whole model "
        f"(the plan priced the adapters'). {instead}"
    ]


def peft_lines(job: Job) -> list[str]:
    """`peft_config` as Python lines for a train.py (comments of a YAML / shell / TOML file)."""
    cfg = peft_config(job)
    if cfg is None:
        return []
    lines = [f"Training method {job.training.method}: the base is frozen; in train.py, before preparing the model:"]
    if "bitsandbytes_config" in cfg:
        args = ", ".join(
            f"{k}=torch.{v}" if k.endswith("_dtype") or k.endswith("_storage") else f"{k}={v!r}"
            for k, v in cfg["bitsandbytes_config"].items()
        )
        lines.append(f"  model = AutoModelForCausalLM.from_pretrained(..., quantization_config=BitsAndBytesConfig({args}))")
    lora = ", ".join(f"{k}={v!r}" for k, v in cfg["lora_config"].items())
    lines.append(f"  model = peft.get_peft_model(model, peft.LoraConfig({lora}))")
    return lines


def fp8_note(job: Job, target: str, recipe: str) -> list[str]:
    """What an FP8 plan's price assumed and what the file runs: one fitted FP8 GEMM rate
    (`cost_models.calibration`, fitted on published FP8 runs whatever their scaling recipe), and the
    target's recipe, which the file names."""
    if job.training.precision != "fp8":
        return []
    return [
        f"FP8 scaling recipe: this file runs {recipe}; the plan priced FP8 GEMMs at one rate fitted on published "
        "FP8 runs (cost_models/data/calibration.json), not per recipe"
    ]
