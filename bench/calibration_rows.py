"""Turn the rows of `data/calibration/published_runs.csv` into priced-layout inputs.

Each usable row becomes a `CalibrationRow`: (ModelSpec, TrainingSpec, cluster preset, GPUs, Layout,
measured tokens/s/GPU, source id) plus the list of assumptions made where the source is silent.
Rows that cannot be used become an `Unusable` with the reason. Nothing here is fitted; every
assumption is written down next to the row it applies to (see `CalibrationRow.assumptions`).

Conventions applied per source (the CSV's README lists the sources):

- Shapes. GPT-style rows (Megatron README, Narayanan 2021, Korthikanti 2022, NeMo GPT3): GeLU MLP
  of width 4h unless given, LayerNorm, learned absolute positions, MHA, biases on every linear,
  tied input/output embeddings (Megatron's default). Narayanan Table 1 has no head counts: h/128
  heads (head dim 128) is assumed; attention FLOPs and time do not depend on the head count.
  Korthikanti rows have no vocabulary: 51200 (calculon's model files; it reproduces the printed
  MFU to 0.1 point). llm-foundry MPT: ALiBi, vocabulary 50368, expansion 4, no biases, tied
  embeddings, LayerNorm. Llama rows: SwiGLU, RMSNorm, RoPE, GQA from `kv_heads`, untied. Nemotron
  rows: squared-ReLU MLP, LayerNorm, RoPE, untied (vocabulary 256000 where blank, the Nemotron
  tokenizer of the 340B row). Mixtral: SwiGLU experts, `ffn_hidden` is the expert width.
  Nemotron-H rows (hybrid Mamba-2, shape columns blank but the layer count): the `nemotron-h-56b`
  preset.
- Precision: BF16/amp_bf16/bf16 -> bf16; FP8/amp_fp8 -> fp8; FP16/"mixed (16-bit)" -> fp16
  (bf16 where the catalog GPU has no separate fp16 peak: Ampere's fp16 and bf16 tensor-core rates
  are equal). Megatron/NeMo keep fp32 main gradients (`grad_dtype="fp32"`); llm-foundry's
  `amp_bf16` (FSDP mixed precision DEFAULT) reduces gradients in fp32, `bf16` (PURE) in bf16;
  DeepSpeed fp16 keeps fp16 gradients.
- Framework: Megatron-LM / Megatron-Core / NeMo -> "megatron"; llm-foundry -> "fsdp" (ZeRO-3 for
  FULL_SHARD, ZeRO-2 for SHARD_GRAD_OP) with FSDP1's flat parameters (`Layout.fsdp_flat_params`, as
  MaxText), torchtitan -> "fsdp" (FSDP2); DeepSpeed -> "deepspeed".
- Measured tokens/s/GPU: the `tokens_per_s_per_gpu` column when present; else from `step_time_s`
  (global batch tokens / step / GPUs); else `tflops_per_gpu` divided by the FLOPs per token of the
  source's own convention: Megatron README / NeMo / Megatron-Core = `cost_models.flops.step_flops`
  model FLOPs (full-attention, LM head included: NeMo rows that print both TFLOP/s and tokens/s
  agree with it to <1%, see `flops_check`); Narayanan 2021 Eq. 3 =
  96 l h^2 (1 + s/(6h) + V/(16 l h)) per token (counts the recompute forward).
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from cluster_specs.catalog import get_gpu
from cost_models.flops import step_flops
from cost_models.layout import AttentionKernel, Layout
from model_specs.spec import ModelSpec, TrainingSpec

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CSV = Path(os.environ.get("AUTOPAR_CALIBRATION_CSV", REPO / "data" / "calibration" / "published_runs.csv"))

CLUSTER_FOR_FAMILY = {
    "A100-40GB": "dgx-a100-40g",
    "A100-80GB": "dgx-a100-80g",
    "H100-80GB": "dgx-h100",
    "H100-96GB-HBM2e-500W": "grand-teton-h100",
    "H200-141GB": "dgx-h200",
    "B200": "dgx-b200",
    "B300": "dgx-b300",
    "GB200": "gb200-nvl72",
    "GB300": "gb300-nvl72",
}


@dataclass(frozen=True)
class CalibrationRow:
    """One published configuration, ready for `cost_models.estimate.estimate`."""

    row_id: int
    source_id: str
    label: str  # the model name as the source prints it
    model: ModelSpec
    training: TrainingSpec
    cluster_name: str
    gpus: int
    layout: Layout
    measured_tokens_per_s_per_gpu: float | None  # None: a layout-only row (fit check only)
    measured_from: str  # which column the throughput comes from (and the FLOP convention)
    confidence: str
    assumptions: tuple[str, ...] = ()
    reported_tflops_per_gpu: float | None = None
    reported_memory_gib: float | None = None
    memory_kind: str = ""
    recompute_stated: bool = True
    """False: the source does not say which recompute ran (`calibration_report.evaluate_row` then
    takes the least recompute with which the published layout fits: it ran)."""
    flops_check: float | None = None
    """Reported TFLOP/s / (reported tokens/s x our model FLOPs per token), where the row prints both:
    1.0 means the source's FLOP convention equals `cost_models.flops` model FLOPs."""
    megatron_core_before_0_10: bool = False
    """The row ran on a Megatron-Core before 0.10 (`RecipeSwitches.megatron_core_before_0_10`): no MoE
    parallel folding, no FSDP, no optimizer offload."""
    distributed_optimizer: bool = True
    """False: the row's stack had no sharded optimizer at all (Megatron-LM of 2021-22, whose rows the
    loader prices at ZeRO-0): `bench.published_vs_plan` searches it without ZeRO or offload."""
    before_megatron_lm_3: bool = False
    """True: the row ran Megatron-LM's model code before v3.0 (`MEGATRON_LM_BEFORE_3`), which had no
    sequence parallelism, no selective recompute and no context parallelism: `bench.published_vs_plan`
    searches it without them."""

    @cached_property
    def cluster(self) -> Any:
        from cluster_specs.presets import get_cluster

        return get_cluster(self.cluster_name)

    @property
    def has_throughput(self) -> bool:
        return self.measured_tokens_per_s_per_gpu is not None

    def layout_str(self) -> str:
        lay = self.layout
        parts = [f"tp{lay.tp}", f"pp{lay.pp}"]
        if lay.vpp > 1:
            parts.append(f"v{lay.vpp}")
        parts.append(f"dp{lay.dp}")
        if lay.cp > 1:
            parts.append(f"cp{lay.cp}")
        if lay.ep > 1:
            parts.append(f"ep{lay.ep}")
        parts.append(f"mb{lay.micro_batch}")
        parts.append(f"z{lay.zero_stage}")
        if lay.recompute != "none":
            parts.append({"full": "rcF", "selective": "rcS", "op_sac": "rcOp"}[lay.recompute])
        if lay.sp:
            parts.append("sp")
        return " ".join(parts)


@dataclass(frozen=True)
class Unusable:
    row_id: int
    source_id: str
    label: str
    reason: str


@dataclass
class _Ctx:
    raw: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def s(self, col: str) -> str:
        return (self.raw.get(col) or "").strip()

    def i(self, col: str) -> int | None:
        v = self.s(col)
        if not v:
            return None
        return int(float(v))

    def f(self, col: str) -> float | None:
        v = self.s(col)
        return float(v) if v else None


class _Skip(Exception):
    pass


# --------------------------------------------------------------------------------------------------
# model shapes
# --------------------------------------------------------------------------------------------------


def _style(c: _Ctx) -> str:
    sid, name = c.s("source_id"), c.s("model").lower()
    if sid == "llmfoundry_mpt":
        return "mpt"
    if "deepseek-v3" in name:
        return "deepseek-v3"
    if "nemotron-h" in name:
        return "nemotron-h"
    if c.i("moe_experts"):
        return "mixtral"
    if "llama" in name:
        return "llama"
    if "nemotron" in name:
        return "nemotron"
    return "gpt"


def _model(c: _Ctx) -> ModelSpec:
    layers, hidden, seq = c.i("layers"), c.i("hidden"), c.i("seq_len")
    style = _style(c)
    if style == "nemotron-h" and layers and seq:
        # the rows name the model and its 118 layers only; the hybrid Mamba-2 shape (54 Mamba, 54
        # MLP, 10 attention layers) comes from the nemotron-h-56b preset (Megatron-Bridge's 56B
        # provider in NemotronHConfig fields)
        from model_specs.presets import get_model

        spec = get_model("nemotron-h-56b")
        if spec.num_layers != layers:
            raise _Skip(f"{layers} layers in the row, the nemotron-h-56b preset has {spec.num_layers}")
        c.notes.append("Nemotron-H-56B shape from the nemotron-h-56b preset (hybrid Mamba-2, Megatron-Bridge 56B provider)")
        return spec.model_copy(update={"name": f"{c.s('model')} (row {c.s('row_id')})"})
    if not (layers and hidden and seq):
        raise _Skip("no model shape (layers / hidden / seq_len blank)")
    if style == "deepseek-v3":
        # the row's shape columns are DeepSeek-V3's (61 layers, 7168, dense FFN 18432, 256 experts
        # top-8); the MLA and shared-expert details come from the preset (its config.json). Multi-
        # token prediction as the recipe code sets it (`RECIPE_SWITCHES`), else priced without.
        from model_specs.presets import get_model

        mtp = next((sw.mtp_layers for sw in _switches(c) if sw.mtp_layers is not None), None)
        c.notes.append("DeepSeek-V3 shape from the deepseek-v3 preset; "
                       + (f"{mtp} MTP module(s) (recipe code)" if mtp is not None else "MTP not stated: priced without"))
        return get_model("deepseek-v3").model_copy(
            update={"name": f"{c.s('model')} (row {c.s('row_id')})", "num_layers": layers, "mtp_layers": mtp or 0}
        )
    heads = c.i("heads")
    vocab = c.i("vocab")
    ffn = c.i("ffn_hidden")
    sid = c.s("source_id")
    if heads is None:
        if sid == "narayanan2021_table1":
            heads = hidden // 128
            c.notes.append(f"heads not in the source: h/128 = {heads} assumed (head dim 128)")
        else:
            raise _Skip("no attention head count")
    if vocab is None:
        if sid.startswith("korthikanti2022"):
            vocab = 51200
            c.notes.append("vocab not in the row: 51200 (calculon's model files; reproduces the printed MFU)")
        elif style == "nemotron":
            vocab = 256000
            c.notes.append("vocab not in the row: 256000 assumed (Nemotron tokenizer, as the 340B row)")
        else:
            raise _Skip("no vocabulary size")
    kv = c.i("kv_heads") or heads
    name = f"{c.s('model')} (row {c.s('row_id')})"
    common: dict[str, Any] = dict(
        name=name, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
        max_position_embeddings=max(seq, 2048),
    )
    if style == "gpt":
        if ffn is None:
            ffn = 4 * hidden
            c.notes.append("ffn_hidden blank: 4h assumed")
        return ModelSpec(
            **common, family="gpt", num_kv_heads=kv, ffn_hidden_size=ffn, mlp="gelu", norm="layernorm",
            qkv_bias=True, attn_out_bias=True, mlp_bias=True, tie_embeddings=True, position_embedding="learned",
        )
    if style == "mpt":
        return ModelSpec(
            **common, family="mpt", num_kv_heads=kv, ffn_hidden_size=ffn or 4 * hidden, mlp="gelu",
            norm="layernorm", tie_embeddings=True, position_embedding="alibi",
        )
    if style == "llama":
        if ffn is None:
            raise _Skip("no ffn_hidden for a Llama row")
        return ModelSpec(**common, family="llama", num_kv_heads=kv, ffn_hidden_size=ffn, mlp="swiglu", norm="rmsnorm")
    if style == "nemotron":
        if ffn is None:
            raise _Skip("no ffn_hidden for a Nemotron row")
        return ModelSpec(**common, family="nemotron", num_kv_heads=kv, ffn_hidden_size=ffn, mlp="relu2", norm="layernorm")
    # mixtral
    experts, topk = c.i("moe_experts"), c.i("moe_topk")
    if ffn is None or not topk:
        raise _Skip("MoE row without expert width or top-k")
    return ModelSpec(
        **common, family="mixtral", num_kv_heads=kv, ffn_hidden_size=ffn, mlp="swiglu", norm="rmsnorm",
        num_experts=experts or 0, moe_top_k=topk, moe_ffn_hidden_size=ffn,
    )


# --------------------------------------------------------------------------------------------------
# precision, framework, layout
# --------------------------------------------------------------------------------------------------


def _framework(c: _Ctx) -> str:
    fw = c.s("framework").lower()
    if "llm-foundry" in fw or "composer" in fw:
        return "fsdp"
    if "torchtitan" in fw:
        return "fsdp"
    if "maxtext" in fw:
        # MaxText shards parameters, gradients and optimizer state over its `fsdp` mesh axis and
        # replicates over `data`: FSDP-style ZeRO-3 with hybrid sharding, priced as framework fsdp
        c.notes.append("MaxText (JAX) priced as FSDP ZeRO-3 (its fsdp mesh axis); XLA kernels as PyTorch's")
        return "fsdp"
    if "deepspeed" in fw:
        return "deepspeed"
    if "megatron" in fw or "nemo" in fw:
        return "megatron"
    raise _Skip(f"unknown framework {c.s('framework')!r}")


def _precision(c: _Ctx, gpu_family: str, framework: str) -> tuple[str, str]:
    """(compute precision, gradient dtype)."""
    p = c.s("precision").lower()
    if "fp8" in p or "float8" in p:  # torchtitan: "BF16 + Float8 linears" (torchao float8 GEMMs)
        prec = "fp8"
    elif "bf16" in p:
        prec = "bf16"
    elif "fp16" in p or "16-bit" in p or "float16" in p:
        prec = "fp16"
    else:
        raise _Skip(f"precision not stated ({c.s('precision')!r})")
    if prec == "fp16" and "fp16" not in get_gpu(gpu_family).peak_flops_per_s:
        c.notes.append(f"fp16 priced as bf16: the {gpu_family} catalog entry has no fp16 peak (equal rates on Ampere)")
        prec = "bf16"
    if framework == "megatron" and c.s("source_id") == "dgxc_benchmarking":
        # NeMo's performance scripts (scripts/performance, which the DGX Cloud recipes run) set
        # `grad_reduce_in_fp32 = False`: bf16 gradient buffers and bf16 reduce-scatter
        grad = "bf16"
        c.notes.append("NeMo performance recipe: bf16 gradient buffers (grad_reduce_in_fp32 = False)")
    elif framework == "megatron" and c.s("source_id") == "nemo_perf_2407" and prec == "fp8":
        # NeMo 24.07's FP8 performance recipes: the Nemotron-340B row (TP8 PP8 DP2) cannot hold
        # fp32 main gradients (21.5 GiB/GPU on top of 43 GiB of weights and optimizer), yet it ran;
        # bf16 gradient buffers (grad_reduce_in_fp32=False) is the configuration consistent with it.
        grad = "bf16"
        c.notes.append("NeMo FP8 perf recipe: bf16 gradient buffers (the published 340B run needs them to fit)")
    elif framework == "megatron":
        grad = "fp32"
    elif framework == "fsdp":
        # FSDP keeps fp32 sharded weights + fp32 sharded grads + Adam m, v = 16 B/param under both
        # DEFAULT and PURE mixed precision, which `grad_dtype="bf16"` reproduces (2 + 2 + 12). The
        # DEFAULT mode's fp32 gradient reduce-scatter (2x the bytes) is therefore priced at bf16.
        grad = "bf16"
        if "default" in p:
            c.notes.append("FSDP DEFAULT reduces grads in fp32; priced as bf16 (keeps the 16 B/param total exact)")
    else:
        grad = "bf16"
    return prec, grad


def _recompute(c: _Ctx, default: str) -> str:
    r = c.s("recompute").lower()
    if not r:
        c.notes.append(f"recompute not stated: {default}")
        return default
    if r.startswith("full"):
        return "full"
    if r.startswith("selective") and "op-level" in r:
        return "op_sac"
    if r.startswith("selective"):
        return "selective"
    if r.startswith("none"):
        return "none"
    raise _Skip(f"unknown recompute {r!r}")


def _sp(c: _Ctx, tp: int, default: bool | None) -> bool:
    s = c.s("sequence_parallel").lower()
    if s in ("yes", "true", "on"):
        return tp > 1
    if s in ("no", "false", "off"):
        return False
    value = (tp > 1) if default is None else (default and tp > 1)
    if tp > 1:
        c.notes.append(f"sequence parallel not stated: {'on' if value else 'off'}")
    return value


_VPP_FROM_PAIRED_ROW: dict[tuple[str, int], int] = {}

MEGATRON_LM_2021_22 = ("narayanan2021_table1", "narayanan2021_table2", "korthikanti2022")
MEGATRON_LM_BEFORE_3 = ("narayanan2021_table1", "narayanan2021_table2")
"""Sources measured on Megatron-LM's model code before v3.0 (Narayanan et al. 2021, arXiv 2104.04473:
Megatron-LM's own rows and the Megatron-DeepSpeed ZeRO-3 rows of its Table 2). Sequence parallelism
and selective activation recompute came with Korthikanti et al. (arXiv 2205.05198, May 2022), in
Megatron-LM v3.0; context parallelism with Megatron-Core in 2024. Korthikanti's own rows ran them."""
"""Sources measured on Megatron-LM of 2021-22, before its distributed optimizer (Megatron-LM's
`--use-distributed-optimizer` arrived in 2022, after these papers): optimizer states on every
data-parallel rank."""


@dataclass(frozen=True)
class RecipeSwitches:
    """Settings a recipe's code fixes that its README does not print, read in the code the recipe
    pins (its `setup.sh` names the NeMo and Megatron-LM commits), or the stack it ran on, for the
    rows of one release of a source ("" matches every release) and of one workload ("" every
    model). Unset fields leave the loader's conventions alone."""

    source_id: str
    release: str  # the release tag in the `source` column, e.g. "@v25.05.04"
    model_prefix: str
    citation: str
    tp_comm_overlap: bool | None = None
    recompute_modules: dict[str, tuple[str, ...]] = field(default_factory=dict)  # GPU family -> modules
    outer_stage_layers: tuple[int, int] | None = None  # layers the first and last stage hold fewer than
    outer_stage_slots: int = 0  # ... the others, which hold this many // pp each
    mtp_layers: int | None = None  # multi-token-prediction modules the recipe trains
    attention_kernel: AttentionKernel | None = None  # `Layout.attention_kernel` the recipe's environment selects
    fsdp_root_holds_ends: bool | None = None  # `Layout.fsdp_root_holds_ends` of the stack the rows ran
    megatron_core_before_0_10: bool = False
    """The stack is a Megatron-Core older than 0.10 (February 2025). It lacks what 0.10-0.12 added,
    read in Megatron-LM's megatron/training/arguments.py and megatron/core/parallel_state.py at the
    core_v0.9.0 / 0.10.0 / 0.12.0 tags: MoE parallel folding (0.10; `Layout.moe_parallel_folding` is
    off for its MoE rows), any FSDP (torch FSDP2 `--use-torch-fsdp2` 0.10, `--use-custom-fsdp` 0.12:
    the distributed optimizer, ZeRO-1, is the most it shards) and optimizer CPU offload
    (`--optimizer-cpu-offload`, 0.12). `bench.published_vs_plan.constraints_for` searches its rows
    without them."""

    def applies(self, c: _Ctx) -> bool:
        return (c.s("source_id") == self.source_id and self.release in c.s("source")
                and c.s("model").startswith(self.model_prefix))


RECIPE_SWITCHES: tuple[RecipeSwitches, ...] = (
    RecipeSwitches(
        "torchtitan_2412", "", "",
        "torchtitan of December 2024 (6b03ffa: fully_shard(model, reshard_after_forward=not pp_enabled)) kept the "
        "embedding and the norm + head in FSDP's root group; they became units of their own in "
        "pytorch/torchtitan#1094 (2025-07-28)",
        fsdp_root_holds_ends=True,
    ),
    RecipeSwitches(
        "dgxc_benchmarking", "tag v24.11.1", "",
        "dgxc-benchmarking v24.11.1 runs NeMo's 24.09 container (launch.sh FW_VERSION=24.09): Megatron-Core 0.9",
        megatron_core_before_0_10=True,
    ),
    RecipeSwitches(
        "mcore_moe_readme", "", "", "the Megatron-Core MoE README's figures: Megatron-Core 0.8 / 0.9 (framework column)",
        megatron_core_before_0_10=True,
    ),
    RecipeSwitches(
        "megatron_readme_h100", "", "", "the Megatron-LM README's GPT table: Megatron-Core r0.8.0 (framework column)",
        megatron_core_before_0_10=True,
    ),
    RecipeSwitches(
        "megatron_readme_h100_strong", "", "",
        "the Megatron-LM README's strong scaling: Megatron-Core r0.8.0 (framework column)",
        megatron_core_before_0_10=True,
    ),
    RecipeSwitches(
        "dgxc_benchmarking", "@v25.05.04", "Nemotron-H",
        "dgxc-benchmarking v25.05.04 nemotronh/setup.sh pins NeMo 7a8f1cc; its "
        "scripts/performance/llm/pretrain_nemotronh_56b.py builds `pretrain_recipe()` without "
        "performance_mode, whose trainer holds only the TimingCallback, so no MegatronCommOverlapCallback "
        "turns tp_comm_overlap on (performance_optimizations would add it); the script's custom_env_vars set "
        "NVTE_FUSED_ATTN=0, so Transformer Engine attends with the flash-attn package (FlashAttention-2), "
        "not cuDNN",
        tp_comm_overlap=False, attention_kernel="flash2",
    ),
    RecipeSwitches(
        "dgxc_benchmarking", "@v25.05.04", "DeepSeek-V3",
        "dgxc-benchmarking v25.05.04 deepseek_v3/pretraining/setup.sh pins NeMo 7a8f1cc; its "
        "scripts/performance/llm/pretrain_deepseek_v3.py adds MegatronCommOverlapCallback(tp_comm_overlap=False), "
        "sets selective recompute and num_layers_in_first/last_pipeline_stage = 64 // pp - 1 / - 2, and "
        "builds `pretrain_recipe()`, whose use_mtp defaults to True (one MTP module, "
        "nemo/collections/llm/recipes/deepseek_v3.py); launch.sh passes --recompute_modules mla_up_proj "
        "(H100) / core_attn (GB200)",
        tp_comm_overlap=False, mtp_layers=1,
        recompute_modules={"H100-80GB": ("mla_up_proj",), "GB200": ("core_attn",)},
        outer_stage_layers=(1, 2), outer_stage_slots=64,
    ),
)
"""Recipe code and stack facts for the published layouts of `RecipeSwitches.applies` rows (the search
of `bench.published_vs_plan` keeps the stack's space: a switch a recipe left off is still the
stack's, a feature its Megatron-Core lacked is not)."""


def _switches(c: _Ctx) -> list[RecipeSwitches]:
    """The `RECIPE_SWITCHES` entries that apply to this row."""
    return [sw for sw in RECIPE_SWITCHES if sw.applies(c)]


def _recipe_switches(c: _Ctx, pp: int) -> dict[str, Any]:
    """Layout fields `RECIPE_SWITCHES` fixes for this row (module doc), with a note each."""
    out: dict[str, Any] = {}
    for sw in _switches(c):
        fields: dict[str, Any] = {}
        if sw.tp_comm_overlap is not None:
            fields["tp_comm_overlap"] = sw.tp_comm_overlap
        if sw.attention_kernel is not None:
            fields["attention_kernel"] = sw.attention_kernel
        if sw.fsdp_root_holds_ends is not None:
            fields["fsdp_root_holds_ends"] = sw.fsdp_root_holds_ends
        modules = sw.recompute_modules.get(c.s("gpu_family"))
        if modules and not c.s("recompute"):
            fields["recompute"], fields["recompute_modules"] = "selective", modules
        if sw.outer_stage_layers and pp > 1:
            per = sw.outer_stage_slots // pp
            fields["decoder_first_pipeline_num_layers"] = per - sw.outer_stage_layers[0]
            fields["decoder_last_pipeline_num_layers"] = per - sw.outer_stage_layers[1]
        if not fields:  # a stack-age entry (`megatron_core_before_0_10`): no layout field of its own
            continue
        c.notes.append(f"recipe code: {', '.join(f'{k}={v}' for k, v in fields.items())} ({sw.citation})")
        out.update(fields)
    return out


def _layout(
    c: _Ctx, model: ModelSpec, training: TrainingSpec, framework: str, gpus: int, older_megatron_core: bool = False
) -> Layout:
    """The row's published layout; `older_megatron_core`: it ran on a Megatron-Core before 0.10
    (`RecipeSwitches.megatron_core_before_0_10`), whose MoE layouts have no parallel folding."""
    sid = c.s("source_id")
    tp, pp, cp, ep, vpp = c.i("tp"), c.i("pp"), c.i("cp") or 1, c.i("ep") or 1, c.i("vpp") or 1
    mp = c.i("mp_size")
    if tp is None and pp is None:
        if sid == "narayanan2021_table2" and mp:
            tp, pp = 8, mp // 8
            c.notes.append(f"model-parallel size {mp} split as TP8 x PP{pp} (cli99/llm-analysis reproduction)")
        elif framework == "fsdp":
            tp = pp = 1
        else:
            raise _Skip("parallel layout not stated")
    tp, pp = tp or 1, pp or 1
    if gpus % (tp * pp * cp):
        raise _Skip(f"tp x pp x cp = {tp * pp * cp} does not divide {gpus} GPUs")
    dp = gpus // (tp * pp * cp)
    if c.i("dp") is not None and c.i("dp") != dp:
        c.notes.append(f"dp column {c.i('dp')} != GPUs/(tp pp cp) = {dp}; using {dp}")
    mb = c.i("micro_batch")
    if mb is None:
        mb = 1
        c.notes.append("micro-batch not stated: 1")
    ga = c.i("grad_accum")
    if ga is not None and ga * mb * dp != training.global_batch:
        c.notes.append(f"grad_accum column {ga} inconsistent with batch; derived")
        ga = None
    zero_col = c.s("zero_or_fsdp").upper()
    if framework == "fsdp":
        zero = 2 if "SHARD_GRAD_OP" in zero_col else 3
    elif framework == "deepspeed":
        m = re.search(r"ZERO-(\d)", zero_col)
        zero = int(m.group(1)) if m else 3
    elif sid in MEGATRON_LM_2021_22:
        zero = 0
        c.notes.append("no distributed optimizer (Megatron-LM 2021/22): ZeRO-0")
    else:
        zero = 1
        c.notes.append("distributed optimizer assumed: ZeRO-1")
    if sid == "korthikanti2022" and vpp == 1 and pp > 1:
        paired = _VPP_FROM_PAIRED_ROW.get((c.s("model"), gpus))
        if paired and paired > 1:
            vpp = paired
            c.notes.append(f"vpp {vpp} taken from the paired selective-recompute row (same pipeline)")
    if pp == 1 and vpp > 1:
        c.notes.append(f"virtual pipeline {vpp} printed with PP1: ignored (no pipeline)")
        vpp = 1
    switches = _recipe_switches(c, pp)
    split = {} if "decoder_first_pipeline_num_layers" in switches else _pipeline_split(c, model.num_layers, pp, vpp)
    if pp > 1 and vpp == 1 and not c.s("vpp"):
        c.notes.append("vpp not stated: plain 1F1B")
    dp_shard = None
    m = re.search(r"FSDP=(\d+)", zero_col)
    if framework == "fsdp" and m and int(m.group(1)) < dp:
        dp_shard = int(m.group(1))
        c.notes.append(f"hybrid sharding: parameters sharded over {dp_shard} GPUs, replicated {dp // dp_shard}x")
    etp = c.i("etp")
    if model.num_experts and etp is None and ep > 1:
        c.notes.append("expert tensor parallel not stated: = tp")
    if sid in ("narayanan2021_table1", "narayanan2021_table2", "korthikanti2022"):
        recompute = _recompute(c, "full")
        sp = _sp(c, tp, False)
    elif framework == "deepspeed":
        recompute = _recompute(c, "full")
        sp = False
    elif "maxtext" in c.s("framework").lower():
        # MaxText's recipes rematerialise (policy not printed); without it a 70B layer stack at
        # micro-batch 2 x 4096 tokens holds > 100 GiB of activations per GPU
        recompute = _recompute(c, "full")
        sp = False
    else:
        recompute = switches.get("recompute") or _recompute(c, "none")
        sp = _sp(c, tp, None)
    cross_entropy = None
    if sid == "llmfoundry_mpt":
        # llm-foundry's default loss is flash-attn's fused cross-entropy (gradient written into the
        # bf16 logits), not PyTorch's eager upcast
        cross_entropy = "fused"
        c.notes.append("loss: fused cross-entropy (llm-foundry default)")
    elementwise = "fused"
    if "torchtitan" in c.s("framework").lower() and "torch.compile" not in c.s("source_detail") + c.s("notes"):
        # torchtitan's Llama without torch.compile runs its norms, rotary and SwiGLU op by op
        elementwise = "eager"
        c.notes.append("torchtitan without torch.compile: eager elementwise kernels")
    fields: dict[str, Any] = dict(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, zero_stage=zero, micro_batch=mb, grad_accum=ga,
        dp_shard=dp_shard, recompute=recompute, sp=sp, framework=framework, cross_entropy=cross_entropy,
        elementwise_kernels=elementwise, framework_version=_framework_version(c, framework), **split,
    )
    fw_name = c.s("framework").lower()
    if "maxtext" in fw_name or (sid == "narayanan2021_table2" and framework == "deepspeed"):
        # MaxText on GPU attends with Transformer Engine's cuDNN attention (its dgxc recipes'
        # attention: cudnn_flash_te); Megatron-DeepSpeed (2021) runs Megatron's attention code, not
        # a PyTorch SDPA / FlashAttention-2 kernel
        fields["attention_kernel"] = "fused"
        c.notes.append("attention: fused kernel (not FlashAttention-2)")
    elif sid == "llmfoundry_mpt" and not _llmfoundry_flash2(c):
        # llm-foundry's benchmark scripts before January 2024 left --attn_impl at its default, triton
        fields["attention_kernel"] = "triton_flash"
        c.notes.append("attention: FlashAttention in Triton (llm-foundry attn_impl triton; Layout.attention_kernel triton_flash)")
    elif framework in ("fsdp", "deepspeed"):
        # llm-foundry's attn_impl flash (the flash-attn 2 package); torchtitan's SDPA, whose flash
        # backend (FlashAttention-2) PyTorch preferred after pytorch/pytorch#138522 (October 2024)
        c.notes.append("attention: FlashAttention-2 (Layout.attention_kernel flash2)")
    if framework == "fsdp" and any(name in fw_name for name in ("llm-foundry", "composer", "maxtext")):
        # llm-foundry / Composer wrap PyTorch FSDP1 (FlatParameter); MaxText's XLA shards in place:
        # parameters are views of the gathered buffer, no per-layer copy-out
        fields["fsdp_flat_params"] = True
        c.notes.append("FSDP1-style flat parameters: no FSDP2 copy-out (Layout.fsdp_flat_params)")
    if model.is_moe and older_megatron_core:
        fields["moe_parallel_folding"] = False
        c.notes.append("no MoE parallel folding: EP inside DP, expert TP = TP (Megatron-Core before 0.10)")
    return Layout(**(fields | switches))


LLMFOUNDRY_FLASH2_SECTIONS = ("H100 80GB BF16 (Large Scale, >= 128 GPUs)",)
"""Sections of llm-foundry's `scripts/train/benchmarking/README.md` measured with FlashAttention-2.
That table came with commit 5e85bd62 (2024-01-06), whose `sweep.py` passes `--attn_impl flash` for
every model (the flash-attn 2.4.2 of the `gpu-flash2` extra). The other tables (H100 BF16 and FP8 of
commit b2a43a14, 2023-10-19; the A100 tables before them) came from `sweep.sh` runs that name no
`--attn_impl`, so `submit_benchmarks.py` set its default, `triton` (`parser.add_argument('--attn_impl',
type=str, default='triton')` at b2a43a14 and at 1ef7b4d2, 2023-05-24): llm-foundry's FlashAttention
in Triton (`Layout.attention_kernel` "triton_flash")."""


def _llmfoundry_flash2(c: _Ctx) -> bool:
    """Whether an llm-foundry row's table ran FlashAttention-2 (`LLMFOUNDRY_FLASH2_SECTIONS`), read
    from the row's section name."""
    return any(section in c.s("source_detail") for section in LLMFOUNDRY_FLASH2_SECTIONS)


DEEPSPEED_RELEASES = REPO / "data" / "calibration" / "deepspeed_releases.csv"
"""DeepSpeed's tagged releases with their dates (the data README says how they were read)."""


def _framework_version(c: _Ctx, framework: str) -> str | None:
    """The release a row ran (`Layout.framework_version`), from its published facts only, never
    its measured value; the one place a row is mapped to a release. Only DeepSpeed's releases are
    told apart (`cost_models.zero3_gathers`): a release number in the framework text ("DeepSpeed
    0.3.13"), else the release current when the source appeared, the last one in
    `DEEPSPEED_RELEASES` dated before the month of the source's arXiv identifier (YYMM.NNNNN: the
    runs precede the paper). Without either the row is priced as today's release."""
    if framework != "deepspeed":
        return None
    named = re.search(r"deepspeed\s+v?(\d+\.\d+(?:\.\d+)?)", c.s("framework"), re.IGNORECASE)
    if named:
        c.notes.append(f"DeepSpeed {named.group(1)} (named by the source)")
        return named.group(1)
    arxiv = re.search(r"arXiv\W*(\d{2})(\d{2})\.\d{4,5}", c.s("source"))
    if not arxiv:
        c.notes.append("no DeepSpeed release and no publication date: priced as today's release")
        return None
    month = _dt.date(2000 + int(arxiv.group(1)), int(arxiv.group(2)), 1)
    with DEEPSPEED_RELEASES.open(newline="") as f:
        releases = sorted((_dt.date.fromisoformat(r["date"]), r["version"]) for r in csv.DictReader(f))
    before = [(day, version) for day, version in releases if day < month]
    if not before:
        raise _Skip(f"published {month:%Y-%m}, before DeepSpeed's first ZeRO-3 release ({releases[0][1]})")
    day, version = before[-1]
    c.notes.append(f"DeepSpeed release not stated: {version} ({day}), the last before the source's arXiv month {month:%Y-%m}")
    return version


def _megatron_core_before_0_10(c: _Ctx, framework: str) -> bool:
    """Whether the row ran on a Megatron-Core before 0.10 (`RecipeSwitches.megatron_core_before_0_10`);
    notes why."""
    older = [sw for sw in _switches(c) if sw.megatron_core_before_0_10]
    if framework != "megatron" or not older:
        return False
    c.notes.append(older[0].citation)
    return True


def _pipeline_split(c: _Ctx, layers: int, pp: int, vpp: int) -> dict[str, Any]:
    """Megatron-Core's uneven split options for a pipeline the layers do not divide.

    With `account_for_embedding_in_pipeline_split` and `account_for_loss_in_pipeline_split` the
    embedding and the loss take one layer slot each, so layers + 2 must divide pp x vpp (Llama 3.1
    405B: 126 + 2 = 8 x 8 x 2): the recipes that print such a layout set both. Otherwise (DeepSeek-V3,
    61 layers on PP8 / PP16) the last pipeline rank takes the remainder
    (`decoder_last_pipeline_num_layers`), the others ceil(layers / pp) each."""
    chunks = pp * vpp
    if pp == 1 or layers % chunks == 0:
        return {}
    if (layers + 2) % chunks == 0:
        c.notes.append(f"{layers} layers + embedding + loss slots = {layers + 2} over pp {pp} x vpp {vpp}: "
                       "account_for_embedding/loss_in_pipeline_split")
        return {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
    if vpp == 1:
        per_rank = -(-layers // pp)
        last = layers - (pp - 1) * per_rank
        if last >= 1:
            c.notes.append(f"uneven pipeline not printed: {per_rank} layers per rank, {last} on the last "
                           "(decoder_last_pipeline_num_layers)")
            return {"decoder_last_pipeline_num_layers": last}
    raise _Skip(f"vpp={vpp} x pp={pp} does not divide {layers} layers (nor layers + 2)")


# --------------------------------------------------------------------------------------------------
# throughput
# --------------------------------------------------------------------------------------------------


def our_model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    return step_flops(model, seq_len, 1).model_flops / seq_len


def narayanan_eq3_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Narayanan et al. 2021 Eq. 3 divided by B*s: 96 l h^2 (1 + s/(6h) + V/(16 l h))."""
    n, h, v = model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * n * h * h * (1 + seq_len / (6 * h) + v / (16 * n * h))


CONSISTENCY_TOLERANCE = 0.10
"""A row that prints both tokens/s/GPU and a step time must agree with itself: tokens per step /
step time / GPUs within this fraction. Where it does not, we cannot tell which figure is wrong,
so the row is kept for the fit check only (no throughput is scored). Rows 472 and 475 (Grok-1 on
512 GB200, DGX Cloud) are the only ones, and the dataset marks them "INCONSISTENT in source":
their aggregate throughput is half of what their batch, step time and MFU give."""


def _throughput(c: _Ctx, model: ModelSpec, training: TrainingSpec, gpus: int) -> tuple[float | None, str]:
    tok = c.f("tokens_per_s_per_gpu")
    step = c.f("step_time_s")
    if tok and step:
        from_step = training.tokens_per_step / step / gpus
        if abs(tok / from_step - 1) > CONSISTENCY_TOLERANCE:
            return None, (
                f"inconsistent source: {tok:.1f} tokens/s/GPU printed, {from_step:.1f} from the batch and step time "
                "(fit check only)"
            )
    if tok:
        return tok, "tokens_per_s_per_gpu"
    if step:
        return training.tokens_per_step / step / gpus, "step_time_s"
    tflops = c.f("tflops_per_gpu")
    if tflops:
        kind = c.s("tflops_kind").lower()
        if "eq.3" in kind or c.s("source_id").startswith("narayanan2021"):
            per_tok = narayanan_eq3_flops_per_token(model, training.seq_len)
            return tflops * 1e12 / per_tok, "tflops_per_gpu / Narayanan Eq.3 FLOPs per token"
        if c.s("source_id") == "llmfoundry_mpt":
            raise _Skip("llm-foundry row without tokens/s")
        per_tok = our_model_flops_per_token(model, training.seq_len)
        return tflops * 1e12 / per_tok, "tflops_per_gpu / model FLOPs per token (Megatron convention)"
    return None, ""


# --------------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------------


def _unusable_reason(c: _Ctx) -> str | None:
    sid = c.s("source_id")
    if sid == "zero2020_fig1":
        return "memory-only analytical row (ZeRO Fig. 1), no model shape or throughput"
    if sid in ("megatron_readme_h100_strong", "korthikanti2022_abstract"):
        return "layout (TP/PP/DP, batch) not stated by the source"
    if sid == "korthikanti2022" and not c.f("step_time_s"):
        return "memory-only row (no-recompute variant, analytical Fig. 1 memory; the source says it does not fit)"
    if c.s("gpu_family") not in CLUSTER_FOR_FAMILY:
        return f"no cluster preset for GPU family {c.s('gpu_family')!r}"
    return None


def parse_row(raw: dict[str, str]) -> CalibrationRow | Unusable:
    c = _Ctx(raw)
    row_id, sid, label = int(c.s("row_id")), c.s("source_id"), c.s("model")
    reason = _unusable_reason(c)
    if reason:
        return Unusable(row_id, sid, label, reason)
    try:
        model = _model(c)
        seq = c.i("seq_len")
        assert seq
        gpus = c.i("gpu_count")
        if not gpus:
            raise _Skip("no GPU count")
        gbs = c.i("global_batch_seqs")
        if gbs is None:
            tokens = c.i("global_batch_tokens")
            if not tokens:
                raise _Skip("no global batch")
            gbs = tokens // seq
        framework = _framework(c)
        family = c.s("gpu_family")
        prec, grad = _precision(c, family, framework)
        training = TrainingSpec(seq_len=seq, global_batch=gbs, precision=prec, grad_dtype=grad)  # type: ignore[arg-type]
        older_megatron_core = _megatron_core_before_0_10(c, framework)
        layout = _layout(c, model, training, framework, gpus, older_megatron_core)
        measured, measured_from = _throughput(c, model, training, gpus)
        sharded_optimizer = not (framework == "megatron" and sid in MEGATRON_LM_2021_22)
    except _Skip as exc:
        return Unusable(row_id, sid, label, str(exc))
    flops_check = None
    tok, tfl = c.f("tokens_per_s_per_gpu"), c.f("tflops_per_gpu")
    if tok and tfl:
        flops_check = tfl * 1e12 / (tok * our_model_flops_per_token(model, training.seq_len))
    if measured is None:
        c.notes.append("no throughput: layout-only row (memory-fit check only)")
    return CalibrationRow(
        row_id=row_id, source_id=sid, label=label, model=model, training=training,
        cluster_name=CLUSTER_FOR_FAMILY[family], gpus=gpus, layout=layout,
        measured_tokens_per_s_per_gpu=measured, measured_from=measured_from, confidence=c.s("confidence"),
        assumptions=tuple(c.notes), reported_tflops_per_gpu=tfl, reported_memory_gib=c.f("memory_per_gpu_gib"),
        memory_kind=c.s("memory_kind"), flops_check=flops_check,
        # stated by the CSV, or fixed by the recipe's code (the only source of recompute_modules here)
        recompute_stated=bool(c.s("recompute")) or layout.recompute_modules is not None,
        megatron_core_before_0_10=older_megatron_core,
        distributed_optimizer=sharded_optimizer,
        before_megatron_lm_3=sid in MEGATRON_LM_BEFORE_3,
    )


def stratum(row: CalibrationRow) -> str:
    """Reporting / split group: the source, except that Narayanan 2021 Table 2 is split by
    framework (Megatron PTD-P rows vs DeepSpeed ZeRO-3 rows measure different software)."""
    if row.source_id == "narayanan2021_table2":
        return f"{row.source_id}/{row.layout.framework}"
    return row.source_id


def read_csv(path: Path | str = DEFAULT_CSV) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def load_rows(path: Path | str = DEFAULT_CSV) -> tuple[list[CalibrationRow], list[Unusable]]:
    """Every row of the CSV: (parsed rows, unusable rows with reasons). Parsed rows include
    layout-only rows (`has_throughput` False), which only take part in the memory-fit check."""
    raws = read_csv(path)
    _VPP_FROM_PAIRED_ROW.clear()
    for r in raws:
        if r["source_id"] == "korthikanti2022" and r.get("vpp"):
            _VPP_FROM_PAIRED_ROW[(r["model"], int(r["gpu_count"]))] = int(r["vpp"])
    rows: list[CalibrationRow] = []
    bad: list[Unusable] = []
    for raw in raws:
        out = parse_row(raw)
        (rows if isinstance(out, CalibrationRow) else bad).append(out)  # type: ignore[arg-type]
    return rows, bad


def reason_counts(bad: list[Unusable]) -> Counter[str]:
    return Counter(u.reason for u in bad)


if __name__ == "__main__":
    rows, bad = load_rows()
    print(f"{len(rows)} parsed rows ({sum(r.has_throughput for r in rows)} with throughput), {len(bad)} unusable")
    for reason, n in reason_counts(bad).most_common():
        print(f"  {n:4d}  {reason}")
    for r in rows:
        if r.source_id != "llmfoundry_mpt":
            print(r.row_id, r.source_id, r.label, r.layout_str(), r.measured_tokens_per_s_per_gpu, r.flops_check)


MEASURED_RUNS = REPO / "data" / "measurements" / "h200-2026-11"
"""This project's own measurements (README.md there): single-GPU runs of the runtime on an H200."""

RUNTIME_RUNS = {"prof_full_none": ("plan_full_none.json", 9001), "prof_full_full": ("plan_full_full.json", 9002)}
"""The runtime's full-training runs on the H200 and the plans whose layouts they ran, with the row
ids they take beside the CSV's (whose ids stay below 1000). The LoRA run is left out: its time
follows the fine-tuning model (`cost_models.finetune`), not the stack constants fitted here."""


def measured_runtime_rows() -> list[CalibrationRow]:
    """The runtime's runs of `RUNTIME_RUNS` as calibration rows of source `autopar_runtime_h200`:
    model, training, cluster and layout from the plan they ran, throughput as measured
    (`runs.json` tokens_per_s; one GPU)."""
    import json

    runs = json.loads((MEASURED_RUNS / "runs.json").read_text())
    out = []
    for name, (plan_file, row_id) in RUNTIME_RUNS.items():
        plan = json.loads((MEASURED_RUNS / plan_file).read_text())
        inputs = plan["inputs"]
        model = ModelSpec(**inputs["model"])
        training = TrainingSpec(**inputs["training"])
        layout = Layout(**plan["best"]["layout"])
        out.append(CalibrationRow(
            row_id=row_id, source_id="autopar_runtime_h200", label=f"{model.name} ({name})", model=model,
            training=training, cluster_name=inputs["cluster"]["name"], gpus=int(inputs["gpus"]), layout=layout,
            measured_tokens_per_s_per_gpu=float(runs[name]["tokens_per_s"]) / int(inputs["gpus"]),
            measured_from="data/measurements/h200-2026-11/runs.json tokens_per_s", confidence="measured",
            assumptions=(f"the layout of {plan_file}, as the runtime ran it",),
        ))
    return out
