"""Published fine-tuning runs (`data/calibration/finetune_runs.csv`) and the H200 LoRA runs of
2026-11 (`data/measurements/h200-2026-11`) against the cost model, each run priced in its own stack.

    python -m bench.finetune_runs            # the table, the medians, the rows not expressible and why
    python -m bench.finetune_runs --fit      # also refit Calibration.stack_overheads (only those) into
                                             # cost_models/data/calibration.json, after bench.fit_calibration

Every row is priced as the recipe that produced it ran (`RowRecipe`): the stack, its recipe config's
techniques at the commit the row quotes (the CSV's `notes` name the config; the recipe configs are
torchtune's `recipes/configs/llama2/*`, `llama3_1/*`, `llama3_2/*` at those commits; NeMo 24.07's
fine-tuning table; PEFT's MetaMathQA benchmark script), its batch, sequence and parallel layout.
Nothing here is fitted per row: the recipes say what ran, `--fit` fits two constants per stack
(`Calibration.stack_overheads`: its host seconds per kernel launch, `fit_launch`, and its own stretch
of the kernel times, `fit_compute`, in place of its framework's `Stack.compute`) on every row of the
stack with a throughput and, for `hf`, the H200 HF steps (`h200_hf_steps`), with each source family
predicted by the fit without it, keeps the stretch only where that beats the prior on the held-out
families (`fit_overheads`), and writes them beside the other fitted constants (run it after
`bench.fit_calibration`, whose `Stack` constants price the stacks' kernels; each keeps the other's
fields).

What each memory figure measures (`memory_kind`): allocated / active (torch's peak allocated or active
bytes: compared with the priced total less the allocator reserve), reserved (torch's
memory_reserved: the priced allocated bytes times the framework's fragmentation), or not stated
(torchtune's README tables: compared as allocated, and reported apart). A row that ran is a row that
fits: every row is checked against its GPU's capacity with the priced total.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cluster_specs.presets import cluster_from_dict, get_cluster
from cluster_specs.spec import ClusterSpec
from cost_models import stacks
from cost_models.calibration import FITTED_PATH, Calibration, StackOverhead, default_calibration
from cost_models.estimate import Estimate, estimate
from cost_models.layout import Layout
from model_specs.spec import ModelSpec, TrainingSpec

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "data" / "calibration" / "finetune_runs.csv"
H200 = ROOT / "data" / "measurements" / "h200-2026-11"
GIB = 2**30

A6000 = {
    "name": "RTX-A6000", "vendor": "nvidia",
    "peak_dense": {"bf16": "154.8 TFLOPS", "fp16": "154.8 TFLOPS", "fp32": "38.7 TFLOPS"},
    "memory": "48 GB", "memory_bandwidth": "768 GB/s", "sm_count": 84, "gpu_link": "64 GB/s bidirectional",
    "tdp": "300 W",
    "source": "NVIDIA RTX A6000 datasheet (309.7 TFLOPS tensor with sparsity: 154.8 dense; 48 GB GDDR6, 768 GB/s, "
    "84 SMs), https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/"
    "proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf",
}
"""The RTX A6000 of torchtune's README rows (not a catalog GPU: a workstation card), as an inline GPU."""

CLUSTERS: dict[str, dict[str, Any] | str] = {
    "RTX4090-24GB": "rtx4090-pcie-8",
    "A6000-48GB": {"preset": "l40s-pcie-8", "name": "rtx-a6000-workstation", "gpu": A6000},
    "A100": "dgx-a100-80g",  # the flags table peaks at 60 GiB and the 70B rows at 70.4 GB: the 80 GB part
    "A100-80GB": "dgx-a100-80g",
    "L40S-48GB": "l40s-pcie-8",
    "H100-80GB": "dgx-h100",
}


def _cluster(family: str) -> ClusterSpec:
    ref = CLUSTERS[family]
    return get_cluster(ref) if isinstance(ref, str) else cluster_from_dict(ref)


def _model(row: dict[str, str]) -> ModelSpec:
    """The Llama shape of a row (the CSV's columns, from the model builders it cites). Llama 3.2 3B
    ties its embeddings (its config.json: tie_word_embeddings true); Llama 2 / 3.1 do not."""
    name = row["model"]
    llama3 = "3." in name or "3.1" in name or "3.2" in name or "Llama-3" in name
    return ModelSpec(
        name=name.lower().replace(" ", "-"), family="llama", vocab_size=int(row["vocab"]),
        hidden_size=int(row["hidden"]), num_layers=int(row["layers"]), num_heads=int(row["heads"]),
        num_kv_heads=int(row["kv_heads"]), ffn_hidden_size=int(row["ffn_hidden"]),
        tie_embeddings="3.2" in name or "3.2-3B" in name,
        rope_theta=500000.0 if llama3 else 10000.0,
    )


@dataclass(frozen=True)
class RowRecipe:
    """How a published row ran: its stack's recipe config at the row's commit (module doc)."""

    stack: str | None
    framework: str = "fsdp"
    zero: int = 0
    recompute: str = "none"  # "auto": not stated, the fastest mode that fits
    compile: bool = False
    loss: str | None = None  # the stack's default when None
    optimizer_state: str = "full"
    optimizer_in_backward: bool = False
    offload_activations: bool = False
    offload: bool = False  # FSDP CPU offload of parameters, gradients and optimizer
    targets: tuple[str, ...] | None = None
    rank: int | None = None
    tp: int = 1
    pp: int = 1
    master_weights: bool | None = None
    dora: bool = False
    padded: bool = False  # not packed: time priced at the mean real tokens (module doc)
    fused_optimizer: bool = True
    source: str = ""
    layout_extra: dict[str, Any] = field(default_factory=dict)


TT_ATTN_MLP = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TT_QVO_MLP = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QV = ("q_proj", "v_proj")
QKV = ("q_proj", "k_proj", "v_proj")
_TT24 = "torchtune README 2024-09 (commit 30b8519e): batch 2, packed 2048, torch.compile on; "
_FLAGS = "torchtune README optimization flags (2024-11): Llama 3.2 3B, batch 2, packed 4096; "
RECIPES: dict[str, RowRecipe] = {
    "F001": RowRecipe("torchtune", recompute="full", compile=True, optimizer_state="int8_paged", optimizer_in_backward=True,
                      source=_TT24 + "8B_full_single_device: PagedAdamW8bit, optimizer_in_bwd, activation checkpointing"),
    "F002": RowRecipe("torchtune", recompute="full", compile=True, optimizer_state="int8_paged", optimizer_in_backward=True,
                      source=_TT24 + "8B_full_single_device (the A6000 row restates no setting)"),
    "F003": RowRecipe("torchtune", recompute="full", compile=True, targets=QV, rank=8, source=_TT24 + "8B_lora_single_device"),
    "F004": RowRecipe("torchtune", recompute="full", compile=True, targets=QV, rank=8, source=_TT24 + "8B_lora_single_device"),
    "F005": RowRecipe("torchtune", recompute="full", compile=True, targets=TT_ATTN_MLP, rank=8, source=_TT24 + "8B_qlora_single_device"),
    "F006": RowRecipe("torchtune", zero=3, recompute="full", compile=True, offload=True,
                      source=_TT24 + "70B_full: FSDP with fsdp_cpu_offload (parameters, gradients, optimizer on the host)"),
    "F007": RowRecipe("torchtune", zero=3, recompute="full", compile=True, targets=QKV, rank=16, source=_TT24 + "70B_lora: FSDP"),
    "F008": RowRecipe("torchtune", zero=3, recompute="full", compile=True, targets=TT_ATTN_MLP, rank=16, source=_TT24 + "405B_qlora: FSDP"),
    "F022": RowRecipe("torchtune", loss="eager", source=_FLAGS + "baseline + packed (no compile, eager loss, no checkpointing)"),
    "F023": RowRecipe("torchtune", loss="eager", compile=True, source=_FLAGS + "+ compile"),
    "F024": RowRecipe("torchtune", compile=True, source=_FLAGS + "+ chunked cross-entropy"),
    "F025": RowRecipe("torchtune", compile=True, recompute="full", source=_FLAGS + "+ activation checkpointing"),
    "F026": RowRecipe("torchtune", compile=True, recompute="full", optimizer_in_backward=True, source=_FLAGS + "+ optimizer_in_bwd"),
    "F027": RowRecipe("torchtune", compile=True, recompute="full", optimizer_in_backward=True, offload_activations=True,
                      source=_FLAGS + "+ activation offloading"),
    "F028": RowRecipe("torchtune", compile=True, recompute="full", optimizer_in_backward=True, offload_activations=True,
                      optimizer_state="int8", source=_FLAGS + "+ 8-bit AdamW"),
    "F029": RowRecipe("torchtune", compile=True, recompute="full", offload_activations=True, targets=TT_QVO_MLP, rank=64,
                      source=_FLAGS + "LoRA (3B_lora_single_device: r64, q, v, output + MLP)"),
    "F030": RowRecipe("torchtune", compile=True, recompute="full", offload_activations=True, targets=TT_QVO_MLP, rank=64,
                      source=_FLAGS + "QLoRA (3B_qlora_single_device)"),
    "F040": RowRecipe(None, "megatron", 1, recompute="auto", source="NeMo 24.07 fine-tuning table: SFT, TP1 PP1, FP8, packed 4096"),
    "F041": RowRecipe(None, "megatron", 1, recompute="auto", pp=4, source="NeMo 24.07: SFT, TP1 PP4"),
    "F042": RowRecipe(None, "megatron", 1, recompute="auto", tp=4, pp=4, source="NeMo 24.07: SFT, TP4 PP4"),
    "F043": RowRecipe(None, "megatron", 1, recompute="auto", targets=QKV, rank=32,
                      source="NeMo 24.07: LoRA, TP1 PP1 (NeMo's LoRA default: adapter_dim 32 on attention_qkv)"),
    "F044": RowRecipe(None, "megatron", 1, recompute="auto", targets=QKV, rank=32, source="NeMo 24.07: LoRA, TP1 PP1"),
    "F045": RowRecipe(None, "megatron", 1, recompute="auto", tp=2, pp=4, targets=QKV, rank=32, source="NeMo 24.07: LoRA, TP2 PP4"),
}
_PEFT = ("PEFT MetaMathQA benchmark (method_comparison/MetaMathQA: bf16 model, no autocast, no checkpointing, "
         "torch.optim.AdamW (foreach), batches of 4 bucketed by length, <= 768 tokens): ")
RECIPES.update({
    "F047": RowRecipe("hf", fused_optimizer=False, master_weights=False, padded=True, source=_PEFT + "full fine-tuning, bf16 weights and AdamW states"),
    "F051": RowRecipe("hf", fused_optimizer=False, padded=True, targets=("gate_proj", "up_proj", "down_proj"), rank=10, source=_PEFT + "LoRA r10 MLP"),
    "F052": RowRecipe("hf", fused_optimizer=False, padded=True, targets=QV, rank=32, dora=True, source=_PEFT + "DoRA r32 q, v"),
    "F054": RowRecipe("hf", fused_optimizer=False, padded=True, targets=QV, rank=32, source=_PEFT + "LoRA r32 q, v"),
    "F055": RowRecipe("hf", fused_optimizer=False, padded=True, targets=QV, rank=64, source=_PEFT + "rsLoRA r64 q, v (LoRA's cost)"),
    "F056": RowRecipe("hf", fused_optimizer=False, padded=True, targets=QV, rank=64, source=_PEFT + "LoRA r64 q, v"),
})

NOT_EXPRESSIBLE: dict[str, str] = {
    **{r: "padded Alpaca batches of unstated lengths (torchtune README 2024-04 / 2024-05: the configs @1e56b807 "
          "train alpaca_cleaned_dataset padded per batch, max_seq_len 512 by default; the table's 'Seq Length = "
          "2048' is a cap the batches do not reach: F011's 4 x 2048 tokens without checkpointing cannot fit 24 GB)"
       for r in ("F009", "F010", "F011", "F012", "F013", "F014", "F015", "F016", "F017", "F018", "F019", "F020")},
    "F021": "padded Alpaca batches of unstated lengths (the flags table's unpacked baseline)",
    **{r: "sequence length and GPU not stated (torchtune LoRA / QLoRA tutorials, memory only)"
       for r in ("F031", "F032", "F033", "F034", "F035")},
    **{r: "batch, sequence length and checkpointing not stated (torchao low-bit optimizer README)"
       for r in ("F036", "F037", "F038", "F039")},
    **{r: "PEFT method outside the contract (AdaLoRA, IA3, LoHa, LoKr, LoRA-FA, OFT, prompt tuning, VeRA)"
       for r in ("F046", "F048", "F049", "F050", "F053", "F057", "F058", "F059")},
}


def _memory_kind(row: dict[str, str]) -> str:
    kind = row["memory_kind"].lower()
    if "active" in kind:
        return "active"
    if "reserved" in kind and "not stated" not in kind:
        return "reserved"
    if "allocated" in kind and "not stated" not in kind:
        return "allocated"
    return "not stated" if row["memory_per_gpu_gib"] else "none"


def _mean_tokens(row: dict[str, str]) -> int | None:
    """Real tokens per sequence of a padded row: the run's `train total tokens` over its samples (the
    notes quote both from the result file). Its `train_time` is no measure of the steps: PEFT's
    MetaMathQA `run.py` stops that clock after the test-set generation and the wiki loss passes
    (942 s against 585 s of steps for the r32 LoRA run), which overstated the tokens per sequence
    by 1.6x (339 against 210)."""
    notes = row["notes"]
    if "train total tokens" not in notes:
        return None
    tokens = int(notes.split("train total tokens ")[1].split(" ")[0])
    steps = int(notes.split(" s for ")[1].split(" steps")[0])
    return round(tokens / (steps * int(row["micro_batch"])))


@dataclass
class PricedRow:
    row_id: str
    stack: str
    layout: Layout
    est: Estimate
    time_est: Estimate
    published_tps: float | None
    published_gib: float | None
    memory_kind: str
    predicted_gib: float
    capacity_gib: float
    source: str

    @property
    def predicted_tps(self) -> float:
        return self.time_est.tokens_per_s_per_gpu

    @property
    def tps_ratio(self) -> float | None:
        return self.predicted_tps / self.published_tps if self.published_tps else None

    @property
    def memory_ratio(self) -> float | None:
        return self.predicted_gib / self.published_gib if self.published_gib else None


def job_of(row: dict[str, str]) -> tuple[ModelSpec, TrainingSpec, TrainingSpec, ClusterSpec, int, Layout, RowRecipe]:
    """The model, the training (memory, and time when padded), cluster, GPUs and layout of a row."""
    rec = RECIPES[row["row_id"]]
    model = _model(row)
    gpus = int(row["gpu_count"])
    mb = int(row["micro_batch"])
    seq = int(row["seq_len"])
    dp = gpus // (rec.tp * rec.pp)
    gbs = int(row["global_batch_seqs"]) if row["global_batch_seqs"] else mb * dp
    precision = "fp8" if row["precision"] == "FP8" else "bf16"
    method = row["method"].split(" ")[0]
    method = {"dora": "lora", "rslora": "lora"}.get(method, method)
    fields: dict[str, Any] = {"seq_len": seq, "global_batch": gbs, "precision": precision, "method": method}
    if method != "full":
        fields.update(lora_rank=rec.rank, lora_targets=list(rec.targets or QV), lora_alpha=2.0 * (rec.rank or 8))
        if rec.dora:
            fields["dora"] = True
    if rec.master_weights is not None:
        fields["master_weights"] = rec.master_weights
    training = TrainingSpec(**fields)
    time_training = training
    if rec.padded:
        mean = _mean_tokens(row)
        training = TrainingSpec(**{**fields, "mean_tokens_per_sequence": mean})
        # the step's compute at the mean real length (the batch's padding is not priced: module doc)
        time_training = TrainingSpec(**{**fields, "seq_len": mean})
    cluster = _cluster(row["gpu_family"])
    eager = not rec.compile and rec.stack is not None
    lay = Layout(
        tp=rec.tp, pp=rec.pp, dp=dp, zero_stage=rec.zero if dp > 1 or rec.zero else 0, micro_batch=mb,
        recompute="none" if rec.recompute == "auto" else rec.recompute, framework=rec.framework, stack=rec.stack,
        elementwise_kernels="eager" if eager else "fused", norm_kernel="eager_fp32" if eager else "fused",
        cross_entropy=rec.loss, optimizer_state=rec.optimizer_state, optimizer_in_backward=rec.optimizer_in_backward,
        offload_activations=rec.offload_activations, offload_optimizer=rec.offload, offload_params=rec.offload,
        optimizer_fused=rec.fused_optimizer,
        **rec.layout_extra,
    )
    return model, training, time_training, cluster, gpus, lay, rec


def price_row(row: dict[str, str], cal: Calibration | None = None) -> PricedRow:
    model, training, time_training, cluster, gpus, lay, rec = job_of(row)
    if rec.recompute == "auto":  # not stated: the fastest recompute mode that fits, as the planner would choose
        options = [estimate(model, training, cluster, gpus, lay.model_copy(update={"recompute": r}), calibration=cal)
                   for r in ("none", "selective", "full")]
        fitting = [e for e in options if e.fits] or options
        lay = min(fitting, key=lambda e: e.step_s).layout
    est = estimate(model, training, cluster, gpus, lay, calibration=cal)
    time_est = est if time_training is training else estimate(model, time_training, cluster, gpus, lay, calibration=cal)
    if time_training is not training:  # throughput counts the real tokens of the padded step
        time_est = replace(time_est, tokens_per_step=training.tokens_per_step)
    kind = _memory_kind(row)
    worst = est.peak_memory
    allocated = worst.total - worst.reserve
    frag = stacks.fragmentation(cal or default_calibration(), est.layout.framework, est.layout.stack, est.layout.dp_)
    predicted = allocated * (1 + frag) if kind == "reserved" else allocated
    return PricedRow(
        row["row_id"], rec.stack or lay.framework, est.layout, est, time_est,
        float(row["tokens_per_s_per_gpu"]) if row["tokens_per_s_per_gpu"] else None,
        float(row["memory_per_gpu_gib"]) if row["memory_per_gpu_gib"] else None,
        kind, predicted / GIB, est.capacity_bytes / GIB, rec.source,
    )


def read_rows(path: Path = CSV) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


# ---- the H200 runs ---------------------------------------------------------------------------------
def h200_runs(cal: Calibration | None = None) -> list[dict[str, Any]]:
    """The runtime's LoRA run (`prof_lora16`, priced with its own plan's inputs and layout) and HF +
    PEFT's (`hf_lora`: the same job on 32 layers in the hf stack: eager kernels, SDPA, bf16 base, no
    checkpointing, `hf_peer.py`), predicted against measured step time and peak allocated memory."""
    from planner.plan import Plan

    runs = json.loads((H200 / "runs.json").read_text())
    plan = Plan.model_validate_json((H200 / "plan_lora_16L.json").read_text())
    inp = plan.inputs
    assert plan.best is not None
    out = []
    lay = plan.best.layout
    est = estimate(inp.model, inp.training, inp.cluster, inp.gpus, lay, calibration=cal)
    prof = runs["prof_lora16"]
    out.append({"run": "prof_lora16 (runtime, 16 layers)", "est": est, "step_s": prof["step_s"],
                "allocated_gib": max(prof["peak_memory_bytes_per_rank"]) / GIB})
    hf = runs["hf_lora"]
    model = inp.model.model_copy(update={"num_layers": hf["layers"], "name": "llama3-8b"})
    hf_lay = lay.model_copy(update={"stack": "hf", "elementwise_kernels": "eager", "norm_kernel": "eager_fp32"})
    est = estimate(model, inp.training, inp.cluster, 1, hf_lay, calibration=cal)
    out.append({"run": "hf_lora (HF + PEFT, 32 layers)", "est": est, "step_s": hf["step_s"],
                "allocated_gib": hf["max_allocated"] / GIB})
    return out


# ---- the fit -----------------------------------------------------------------------------------------
def _with(cal: Calibration, overheads: dict[str, StackOverhead]) -> Calibration:
    return replace(cal, stack_overheads=overheads)


H200_HF_FAMILY = "autopar H200 HF runs (2026-11)"
"""The source family of the H200 steps of transformers' `LlamaForCausalLM` (`hf_peer.py`, `h200_hf_steps`):
the HF + PEFT LoRA step (`hf_lora`) and the full fine-tune of a float32 model under bf16 autocast
(`hf_full16`, `bench.h200_check.HF_FULL16`), beside the CSV's `source_id`s."""


def h200_hf_steps(cal: Calibration | None = None) -> list[tuple[float, float]]:
    """(predicted, measured) step seconds of the hf stack's H200 runs (`H200_HF_FAMILY`)."""
    from bench.h200_check import hf_full16

    lora = h200_runs(cal)[1]
    full = hf_full16(cal)
    return [(lora["est"].step_s, lora["step_s"]), (full[0], full[1])]

COMPUTE_BOUNDS = (0.5, 3.0)
"""Bounds of a stack's kernel-time stretch (`StackOverhead.compute`): those `bench.fit_calibration` gives
the frameworks' `Stack.compute`."""

LAUNCH_BOUNDS_US = (2.0, 100.0)
"""Bounds of a stack's host microseconds per kernel launch: a bare CUDA launch (2-4 us, CUDA C++ Best
Practices Guide) to ten times a PyTorch eager op's dispatch through Python modules (10-20 us)."""


def fit_families(rows: list[dict[str, str]], stack: str) -> dict[str, list[dict[str, str]] | None]:
    """The throughput rows of `stack` by source family (the CSV's `source_id`); the H200 HF + PEFT
    step (`h200_runs`) is a family of its own for `hf` (None: that run, not a CSV row)."""
    fams: dict[str, list[dict[str, str]] | None] = {}
    for r in rows:
        rec = RECIPES.get(r["row_id"])
        if rec is not None and rec.stack == stack and r["tokens_per_s_per_gpu"]:
            fams.setdefault(r["source_id"], []).append(r)  # type: ignore[union-attr]
    if stack == "hf":
        fams[H200_HF_FAMILY] = None
    return fams


def _log_errors(cal: Calibration, fams: dict[str, list[dict[str, str]] | None]) -> dict[str, list[float]]:
    """log(predicted / measured) tokens/s (step time for the H200 runs: the inverse sign) per family."""
    out: dict[str, list[float]] = {}
    for fam, rows in fams.items():
        if rows is None:
            out[fam] = [math.log(measured / predicted) for predicted, measured in h200_hf_steps(cal)]
        else:
            out[fam] = [math.log(price_row(r, cal).tps_ratio or 1.0) for r in rows]
    return out


def fit_launch(cal: Calibration, stack: str, fams: dict[str, list[dict[str, str]] | None]) -> tuple[float, tuple[float, float]]:
    """(the stack's host seconds per kernel launch, the interval of values at the minimum) minimizing
    the family-balanced squared log error (each family's rows weigh 1 in all) over `fams`, in
    `LAUNCH_BOUNDS_US`. The loss is flat wherever the launch floor binds no layer of any row: on a
    log-spaced grid of 41 values (10% apart) every value within 1e-9 of the least loss is a minimum,
    and the one nearest the stack's prior (`calibration._default_stack_overheads`) is kept, the
    prior itself when it is one (the rows do not identify the constant), refined by a bounded
    golden-section search where the minimum is a single point."""
    from scipy.optimize import minimize_scalar

    def loss(log_us: float) -> float:
        o = replace(cal.stack_overhead(stack), step_s=0.0, micro_batch_s=0.0, kernel_launch_s=math.exp(log_us) * 1e-6)
        errs = _log_errors(_with(cal, {**cal.stack_overheads, stack: o}), fams)
        return sum(sum(e * e for e in es) / len(es) for es in errs.values() if es)

    lo, hi = (math.log(b) for b in LAUNCH_BOUNDS_US)
    grid = [lo + (hi - lo) * i / 40 for i in range(41)]
    values = [loss(g) for g in grid]
    least = min(values)
    flat = [g for g, v in zip(grid, values, strict=True) if v <= least + 1e-9]
    interval = (math.exp(flat[0]) * 1e-6, math.exp(flat[-1]) * 1e-6)
    prior = math.log(Calibration().stack_overhead(stack).kernel_launch_s * 1e6)
    if len(flat) > 1 and flat[0] <= prior <= flat[-1] and all(v <= least + 1e-9 for g, v in zip(grid, values, strict=True)
                                                               if flat[0] <= g <= flat[-1]):
        return math.exp(prior) * 1e-6, interval
    best = min(range(len(grid)), key=lambda i: (values[i] > least + 1e-9, abs(grid[i] - prior)))
    if len(flat) > 1:
        return math.exp(grid[best]) * 1e-6, interval
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    refined = minimize_scalar(loss, bounds=(a, b), method="bounded", options={"xatol": 1e-3})
    x = refined.x if refined.fun < values[best] else grid[best]
    return math.exp(x) * 1e-6, (math.exp(x) * 1e-6, math.exp(x) * 1e-6)


def _loss(cal: Calibration, stack: str, o: StackOverhead, fams: dict[str, list[dict[str, str]] | None]) -> float:
    """The family-balanced squared log error (`fit_launch`) with the stack's constants `o`."""
    errs = _log_errors(_with(cal, {**cal.stack_overheads, stack: o}), fams)
    return sum(sum(e * e for e in es) / len(es) for es in errs.values() if es)


def fit_compute(cal: Calibration, stack: str, fams: dict[str, list[dict[str, str]] | None]) -> tuple[float, bool]:
    """(the stack's kernel-time stretch minimizing the family-balanced squared log error over `fams`
    with its stored launch cost, whether it sits at a bound of `COMPUTE_BOUNDS`): a bounded
    golden-section search over the log of the stretch (scipy `minimize_scalar`)."""
    from scipy.optimize import minimize_scalar

    base = cal.stack_overhead(stack)
    lo, hi = (math.log(b) for b in COMPUTE_BOUNDS)
    found = minimize_scalar(lambda x: _loss(cal, stack, replace(base, compute=math.exp(x)), fams), bounds=(lo, hi),
                            method="bounded", options={"xatol": 1e-3})
    x = float(found.x)
    return math.exp(x), bool(min(x - lo, hi - x) < 1e-2)


def fit_stack(cal: Calibration, stack: str, fams: dict[str, list[dict[str, str]] | None]) -> tuple[StackOverhead, dict[str, Any]]:
    """The stack's host seconds per kernel launch and kernel-time stretch (`StackOverhead.kernel_launch_s`,
    `compute`) fitted on `fams`, one after the other twice (coordinate descent from the priors: the
    launch cost `fit_launch` at the stretch, then the stretch `fit_compute` at that launch cost), and
    how well the rows tell them apart: the interval of launch costs at the least loss, whether the
    stretch ran to a bound, and the loss's curvature in the log of the stretch at its minimum (0: the
    rows do not identify it). Whether the stretch is kept is `fit_overheads`' call."""
    o = replace(Calibration().stack_overhead(stack), step_s=0.0, micro_batch_s=0.0)
    interval: tuple[float, float] = (o.kernel_launch_s, o.kernel_launch_s)
    at_bound = False
    for _ in range(2):
        launch, interval = fit_launch(_with(cal, {**cal.stack_overheads, stack: o}), stack, fams)
        o = replace(o, kernel_launch_s=launch)
        compute, at_bound = fit_compute(_with(cal, {**cal.stack_overheads, stack: o}), stack, fams)
        o = replace(o, compute=compute)
    assert o.compute is not None
    step = 0.02  # in the log of the stretch
    around = [_loss(cal, stack, replace(o, compute=o.compute * math.exp(d)), fams) for d in (-step, 0.0, step)]
    curvature = (around[0] - 2 * around[1] + around[2]) / step**2
    info = {"kernel_launch_s": o.kernel_launch_s, "minimum_over_s": list(interval), "launch_identified": interval[0] == interval[1],
            "compute": o.compute, "compute_at_bound": at_bound, "compute_curvature": float(curvature)}
    return o, info


def prior_stretch(cal: Calibration, stack: str, fams: dict[str, list[dict[str, str]] | None]) -> StackOverhead:
    """The stack's constants with the prior stretch (`StackOverhead.compute` None: its framework's
    `Stack.compute`) and the launch cost fitted at it (`fit_launch`)."""
    o = StackOverhead()
    return replace(o, kernel_launch_s=fit_launch(_with(cal, {**cal.stack_overheads, stack: o}), stack, fams)[0])


def _apes(errs: list[float]) -> dict[str, float]:
    ape = sorted(100 * abs(math.exp(e) - 1) for e in errs)
    return {"median_ape": statistics.median(ape), "max_ape": ape[-1]}


def fit_overheads(rows: list[dict[str, str]], cal: Calibration) -> tuple[dict[str, StackOverhead], dict[str, Any]]:
    """Each stack's host seconds per kernel launch and kernel-time stretch (`fit_stack`) on its
    throughput rows and, for `hf`, the H200 HF steps; and each source family predicted by the fit
    without it (leave-one-family-out), beside its prediction with the prior stretch (the framework's
    `Stack.compute`) and the launch cost fitted without it (`prior_stretch`). The stack's own stretch is
    kept only where the rows identify it (not at a bound, the loss curved at its minimum) and it
    predicts the held-out families no worse than the prior does (mean of their median errors): a
    stretch that fits the stack's families together but predicts each of them worse from the others
    describes their disagreement, not the stack. Otherwise the prior stands, with the launch cost
    fitted at it. Per step and per micro-batch host seconds stay 0: every published stack row runs
    one micro-batch per optimizer step, so they cannot be told from the launch cost, and fitted beside
    it both sat at their 0 bound. Returns (the overheads, the report stored beside them)."""
    overheads = dict(cal.stack_overheads)
    summary: dict[str, Any] = {"objective": "family-balanced squared log error of tokens/s (step time for the H200 runs)",
                               "stacks": {}}
    for stack in stacks.STACKS:
        fams = fit_families(rows, stack)
        own, info = fit_stack(cal, stack, fams)
        held: dict[str, Any] = {}
        for fam in fams:
            rest = {k: v for k, v in fams.items() if k != fam}
            if not rest:
                continue
            without, rest_info = fit_stack(cal, stack, rest)
            errs = _log_errors(_with(cal, {**overheads, stack: without}), {fam: fams[fam]})[fam]
            prior = prior_stretch(cal, stack, rest)
            prior_errs = _log_errors(_with(cal, {**overheads, stack: prior}), {fam: fams[fam]})[fam]
            held[fam] = {"n": len(errs), "kernel_launch_s": without.kernel_launch_s, "compute": without.compute,
                         "compute_at_bound": rest_info["compute_at_bound"], **_apes(errs),
                         "prior_compute": {"kernel_launch_s": prior.kernel_launch_s, **_apes(prior_errs)}}
        own_held = statistics.mean(h["median_ape"] for h in held.values()) if held else math.inf
        prior_held = statistics.mean(h["prior_compute"]["median_ape"] for h in held.values()) if held else 0.0
        identified = not info["compute_at_bound"] and info["compute_curvature"] > 0
        kept = identified and own_held <= prior_held
        overheads[stack] = own if kept else prior_stretch(cal, stack, fams)
        fitted = _log_errors(_with(cal, overheads), fams)
        summary["stacks"][stack] = {
            **info,
            "compute_identified": identified,
            "held_out_mean_median_ape": {"own_compute": own_held, "prior_compute": prior_held},
            "compute_kept": kept,
            "stored": asdict(overheads[stack]),
            "families": {k: (len(v) if v is not None else len(h200_hf_steps(cal))) for k, v in fams.items()},
            "in_sample_median_ape": statistics.median(100 * abs(math.exp(e) - 1) for es in fitted.values() for e in es),
            "leave_one_family_out": held,
        }
    return overheads, summary


def write_overheads(overheads: dict[str, StackOverhead], path: Path = FITTED_PATH, report: dict[str, Any] | None = None) -> None:
    """Write `Calibration.stack_overheads` into calibration.json, every other field as it is: the
    framework `Stack` constants, their leave-one-family-out figures and the bands stay
    `bench.fit_calibration`'s (which keeps these in turn: `fit_calibration.FITTED_ELSEWHERE`)."""
    from dataclasses import asdict

    from bench.fit_calibration import FITTED_ELSEWHERE

    if not path.exists():
        raise SystemExit(f"{path}: no fitted calibration to add the stack overheads to; run python -m bench.fit_calibration first")
    data = json.loads(path.read_text())
    data["calibration"]["stack_overheads"] = {k: asdict(v) for k, v in overheads.items()}
    data.setdefault("fitted_elsewhere", {})["stack_overheads"] = FITTED_ELSEWHERE["stack_overheads"]
    if report is not None:
        data["stack_overheads_fit"] = report
    path.write_text(json.dumps(data, indent=1) + "\n")


# ---- report ------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * (x - 1):+.0f}%"


def report(cal: Calibration | None = None) -> dict[str, Any]:
    rows = read_rows()
    priced = [price_row(r, cal) for r in rows if r["row_id"] in RECIPES]
    print(f"{'row':5} {'stack':9} {'GPUs':>4} {'layout':38} {'tok/s pred':>10} {'publ':>7} {'err':>6} "
          f"{'GiB pred':>8} {'publ':>6} {'err':>6} {'fits':>4}  memory figure")
    for p in priced:
        lay = p.layout
        knobs = f"z{lay.zero_stage} mb{lay.micro_batch} {lay.recompute}"
        knobs += f" {lay.cross_entropy_}" + (f" {lay.optimizer_state}" if lay.optimizer_state != "full" else "")
        knobs += " oib" if lay.optimizer_in_backward else ""
        knobs += " offl" if lay.offload_activations or lay.offload_params else ""
        knobs += f" tp{lay.tp}pp{lay.pp}" if lay.tp * lay.pp > 1 else ""
        pub_tps = f"{p.published_tps:7.0f}" if p.published_tps else "      -"
        pub_mem = f"{p.published_gib:6.1f}" if p.published_gib else "     -"
        print(f"{p.row_id:5} {p.stack:9} {p.est.gpus:>4} {knobs:38} {p.predicted_tps:10.0f} {pub_tps} {_pct(p.tps_ratio):>6} "
              f"{p.predicted_gib:8.1f} {pub_mem} {_pct(p.memory_ratio) if p.published_gib else '-':>6} "
              f"{'yes' if p.est.fits else 'NO':>4}  {p.memory_kind}")
    tps = [abs(p.tps_ratio - 1) for p in priced if p.tps_ratio]
    stated = [abs(p.memory_ratio - 1) for p in priced if p.memory_ratio and p.memory_kind in ("allocated", "active", "reserved")]
    unstated = [abs(p.memory_ratio - 1) for p in priced if p.memory_ratio and p.memory_kind == "not stated"]
    misfits = [p.row_id for p in priced if not p.est.fits]
    summary = {
        "rows_priced": len(priced),
        "rows_not_expressible": len(NOT_EXPRESSIBLE),
        "predicted_not_to_fit": misfits,
        "throughput_median_abs_error": statistics.median(tps) if tps else None,
        "throughput_rows": len(tps),
        "memory_median_abs_error_allocated_or_reserved": statistics.median(stated) if stated else None,
        "memory_rows_allocated_or_reserved": len(stated),
        "memory_median_abs_error_not_stated": statistics.median(unstated) if unstated else None,
    }
    print()
    print(f"{len(priced)} rows priced; {len(misfits)} predicted not to fit {misfits or ''}")
    print(f"throughput: median |error| {100 * statistics.median(tps):.1f}% over {len(tps)} rows")
    print(f"memory (allocated / active / reserved): median |error| {100 * statistics.median(stated):.1f}% "
          f"over {len(stated)} rows; where not stated (torchtune READMEs): "
          f"{100 * statistics.median(unstated):.1f}% over {len(unstated)} rows")
    reasons: dict[str, list[str]] = {}
    for rid, why in NOT_EXPRESSIBLE.items():
        reasons.setdefault(why, []).append(rid)
    print(f"{len(NOT_EXPRESSIBLE)} rows not expressible:")
    for why, ids in reasons.items():
        print(f"  {len(ids)}: {why} ({', '.join(ids)})")
    print()
    print("H200 LoRA runs (data/measurements/h200-2026-11):")
    for run in h200_runs(cal):
        e = run["est"]
        alloc = (e.peak_memory.total - e.peak_memory.reserve) / GIB
        print(f"  {run['run']:34} step {e.step_s:.3f} s vs {run['step_s']:.3f} s ({_pct(e.step_s / run['step_s'])}); "
              f"peak allocated {alloc:.2f} GiB vs {run['allocated_gib']:.2f} GiB ({_pct(alloc / run['allocated_gib'])})")
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="refit Calibration.stack_overheads into calibration.json")
    args = ap.parse_args(argv)
    cal = default_calibration()
    if args.fit:
        overheads, fit = fit_overheads(read_rows(), cal)
        for name, o in overheads.items():
            st = fit["stacks"][name]
            lo, hi = (x * 1e6 for x in st["minimum_over_s"])
            launch = "fitted" if st["launch_identified"] else f"not identified (least and flat over {lo:.1f}-{hi:.1f} us)"
            held = st["held_out_mean_median_ape"]
            print(f"{name}: own stretch {st['compute']:.3f} at {st['kernel_launch_s'] * 1e6:.1f} us per kernel (launch {launch}; "
                  f"stretch {'at a bound' if st['compute_at_bound'] else 'inside its bounds'}, curvature "
                  f"{st['compute_curvature']:.2f}); held-out families' mean median |error| {held['own_compute']:.1f}% with it, "
                  f"{held['prior_compute']:.1f}% with the framework's stretch")
            kept = f"stretch {o.compute:.3f}" if o.compute is not None else "the framework's stretch (prior)"
            print(f"  stored: {kept}, kernel launch {o.kernel_launch_s * 1e6:.1f} us; in-sample median |error| "
                  f"{st['in_sample_median_ape']:.1f}%")
            for fam, h in st["leave_one_family_out"].items():
                p = h["prior_compute"]
                print(f"  held out {fam:<34} n={h['n']:>2}  refit stretch {h['compute']:.3f}{' (at a bound)' if h['compute_at_bound'] else ''}"
                      f", {h['kernel_launch_s'] * 1e6:5.1f} us: median |error| {h['median_ape']:5.1f}%  max {h['max_ape']:5.1f}%;  "
                      f"framework's stretch, {p['kernel_launch_s'] * 1e6:5.1f} us: {p['median_ape']:5.1f}%  max {p['max_ape']:5.1f}%")
        write_overheads(overheads, report=fit)
        cal = _with(cal, overheads)
    report(cal)


if __name__ == "__main__":
    main()
