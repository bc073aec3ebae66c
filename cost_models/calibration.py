"""Every constant of the cost models that is not physics or measurement, in one place.

Kernel rates are measurements (`cost_models.kernels`: the kernel atlas of each GPU, with their
sources); physics (FLOP counts, bytes moved, collective algorithms) lives in the other modules.
What a whole training step adds to its kernels is not in any kernel measurement: the gaps between
kernels and the small kernels no model prices, the part of each kernel call's fixed latency a
stream exposes, a fixed cost per optimizer step. Those are a few constants per software stack
(`Stack`, per `Layout.framework`), fitted end to end on published runs, and how much of each
collective a framework hides (`Overlap`).

They are *fitted*, not chosen: `bench/fit_calibration.py` fits the `Stack` constants (and
DeepSpeed's collective efficiency) to `data/calibration/published_runs.csv` and writes
`cost_models/data/calibration.json` with the fit, its leave-one-source-family-out errors and the
error bands. The defaults below are the priors the fit starts from (sources in each field's
comment); they are used only when no fitted file exists. No constant is chosen per source family or
per published row.

The `*_efficiency` multipliers of the kernel rates are 1 for the published-run calibration (the
atlas's rates stand); the per-cluster refit from a team's profiles moves them
(`cost_models.profile_calibration`), as it moves the bus efficiencies and the fixed step cost.

Memory constants (CUDA context, allocator fragmentation, NCCL buffers) are not in the published
runs; they are priors with sources, and measured profiles refine them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path

FITTED_PATH = Path(__file__).parent / "data" / "calibration.json"


@dataclass(frozen=True)
class Overlap:
    """How much of each communication a framework hides, where the step-time model
    (`cost_models.step_time`) gives it a window to hide in. The windows themselves are rules, not
    constants (a layer's gather behind the previous layer's compute, the gradient reduction behind
    the last backward, ...); these fractions say how much of a window, or of a collective, the
    framework really uses. 1 = all of it, 0 = none."""

    dp: float = 1.0  # share of the once-per-step gradient reduction / parameter gather window used
    zero3: float = 1.0  # share of a layer's compute window its prefetched ZeRO-3 gather / reduce-scatter uses
    tp: float = 0.0  # share of TP/SP collectives hidden behind GEMMs when TP comm overlap is on
    ep: float = 0.0  # share of the MoE all-to-all hidden behind other work (schedules that overlap it)
    pp: float = 0.5  # share of pipeline send/recv hidden behind compute in the steady state
    bus_efficiency: float = 1.0  # share of the NCCL bus bandwidth the framework's data-parallel /
    # ZeRO collectives reach (how a release splits them into calls: `cost_models.zero3_gathers`)


@dataclass(frozen=True)
class StackOverhead:
    """Host seconds a fine-tuning stack's Python training loop costs (`cost_models.stacks`): per
    optimizer step (the optimizer's loop over parameters, zero_grad, scheduler, logging), per
    micro-batch (collate and copy the batch, loss scaling, metrics), and per kernel launched from
    its eager modules (the launch floor of `cost_models.compute`: op dispatch through Python module
    calls, PEFT's adapter wrappers among them).

    `kernel_launch_s` and `compute` are fitted (`bench/finetune_runs.py --fit`, one each per stack,
    with each source family predicted by the fit without it). Every published stack row runs one
    micro-batch per optimizer step, so the per-step and per-micro-batch seconds cannot be told from
    the launch cost on them; fitted beside it they both went to their 0 bound, and they stay 0."""

    step_s: float = 0.0
    micro_batch_s: float = 0.0
    kernel_launch_s: float = 6e-6
    compute: float | None = None
    """The stack's own multiplier of its kernel times (`Stack.compute`'s meaning: the gaps between
    kernels and the small kernels no model prices) in place of its framework's. Prior None: the
    framework's fitted `Stack.compute` (FSDP's, fitted on multi-GPU pre-training runs with prefetch
    and overlapped collectives, which an eager fine-tuning loop on one to a few GPUs does not run).
    The fit keeps a stack's own value only where its rows identify it and it predicts each source
    family held out no worse than the prior (`bench.finetune_runs.fit_overheads`); on the rows of
    2026-11 it did not (`stack_overheads_fit` in calibration.json), so the prior stands."""


def _default_stack_overheads() -> dict[str, StackOverhead]:
    # Priors of the per-kernel host cost (fitted by bench/finetune_runs.py --fit on
    # data/calibration/finetune_runs.csv and the H200 HF + PEFT run of data/measurements/h200-2026-11):
    # a PyTorch eager op costs 10-20 us of host time through Python modules (PyTorch's "performance
    # tuning guide": CPU-bound eager models; torch.compile's motivation).
    return {
        "hf": StackOverhead(kernel_launch_s=1.5e-5),
        "torchtune": StackOverhead(kernel_launch_s=1.0e-5),
    }


def _default_overlaps() -> dict[str, Overlap]:
    return {
        # Megatron-Core: --overlap-grad-reduce / --overlap-param-gather (bucket windows), TE
        # userbuffers for --tp-comm-overlap (Layout.tp_comm_overlap), batched p2p
        "megatron": Overlap(dp=1.0, zero3=1.0, tp=0.7, ep=0.0, pp=0.7),
        # PyTorch FSDP2 (torchtitan, llm-foundry): backward prefetch of one layer, no TP overlap
        # unless async TP is on
        "fsdp": Overlap(dp=1.0, zero3=1.0, tp=0.5, ep=0.0, pp=0.5),
        # DeepSpeed ZeRO: overlap_comm=true, less aggressive prefetch (today's release; before 0.5.5
        # its ZeRO-3 hid nothing: `cost_models.zero3_gathers`)
        "deepspeed": Overlap(dp=0.8, zero3=0.7, tp=0.0, ep=0.0, pp=0.5),
    }


@dataclass(frozen=True)
class Stack:
    """What one software stack's training step adds to the kernels it runs (fitted per
    `Layout.framework`). The stack itself (framework, its kernels) is an input of every plan."""

    compute: float = 1.0
    """Multiplies the step's kernel times (GEMMs, attention, memory-bound kernels): the gaps
    between back-to-back kernels and the small kernels no model prices (casts, bias and dropout,
    gradient-norm reductions), as a share of kernel time. Prior 1: the atlas's rates as measured."""
    latency_exposed: float = 0.2
    """Share of a kernel call's fixed latency (`cost_models.kernels`: the isolated-call latency of
    the best-measured GPU, about 16 us on the H200 of 2026-11) that each kernel launch of a layer
    adds to the GPU's time in a step: 1 when every kernel waits for its launch (host syncs, eager
    dispatch), 0 when the stream never drains. Prior 0.2: a kernel launch's own GPU-side latency is
    2-4 us of it (CUDA C++ Best Practices Guide, 'kernel launch overhead')."""
    fp8_compute: float = 1.0
    """Multiplies the stack's FP8 GEMM times on top of `compute`: what its FP8 recipe adds to the
    GEMMs the atlas measured (scaling factors and amax reductions, the casts and transposes of
    inputs, weights and gradients, split accumulation in the backward). Prior 1: the measured
    FP8 GEMMs alone."""
    step_s: float = 0.0
    """Fixed seconds per optimizer step (data loading, logging, the optimizer's launches)."""


STACKS = ("megatron", "fsdp", "deepspeed")
"""The software stacks with constants of their own (`stack_key`)."""


def stack_key(framework: str, fsdp_flat_params: bool = False) -> str:
    """The software stack whose `Stack` constants price a layout: its framework (`Layout.framework`).
    FSDP1 (`fsdp_flat_params`) and FSDP2 share one set: fitted apart, each had too few families to
    be predicted without itself (leave-one-family-out: llm-foundry's FSDP1 rows from MaxText's
    alone 60% off at the 90th percentile, torchtitan's FSDP2 rows from the priors 24-33% off)."""
    return framework


def _default_stacks() -> dict[str, Stack]:
    return {name: Stack() for name in STACKS}


def _atlas_nic_efficiency() -> float:
    """The measured scale-out bus bandwidth over the NICs' line rate (`cost_models.kernels.atlas.
    nic_efficiency`), or 0.85 where no atlas measures one (the fit's prior of earlier versions)."""
    from cost_models.kernels.atlas import nic_efficiency

    return nic_efficiency() or 0.85


@dataclass(frozen=True, eq=False)
class Calibration:
    """Fitted constants. Compared and hashed by identity (it keys the pricing caches)."""

    # --- per software stack (fitted) -----------------------------------------------------------
    stacks: dict[str, Stack] = field(default_factory=_default_stacks)
    overlaps: dict[str, Overlap] = field(default_factory=_default_overlaps)
    # --- multipliers of measured kernel rates (1: the atlas; a cluster's profiles move them) ----
    gemm_efficiency: float = 1.0
    """Multiplies the atlas's 16-bit GEMM rates."""
    fp8_gemm_efficiency: float = 1.0
    """Multiplies the atlas's FP8 GEMM rates."""
    attention_efficiency: float = 1.0
    """Multiplies the atlas's fused attention rates (cuDNN / FlashAttention-3 / -4)."""
    flash2_attention_efficiency: float = 1.0
    """Multiplies the atlas's FlashAttention-2 rates."""
    hbm_efficiency: float = 1.0
    """Multiplies the atlas's memory-bound bandwidth."""
    # --- communication -------------------------------------------------------------------------
    intra_bus_efficiency: float = 1.0
    """Multiplies the catalog's intra-node bus bandwidth (already an achievable nccl-tests figure)."""
    inter_bus_efficiency: float = field(default_factory=_atlas_nic_efficiency)
    """Multiplies the scale-out bus bandwidth (NICs' line rate -> NCCL busbw): measured, the large-
    buffer bus bandwidth of the atlas's NIC-spanning all-reduce over its NICs' line rate."""
    step_overhead_s: float = 0.0
    """Fixed seconds per step beyond the stack's (`Stack.step_s`): 0 for the published-run
    calibration; a cluster's profiles set it (`cost_models.profile_calibration`)."""
    stack_overheads: dict[str, StackOverhead] = field(default_factory=_default_stack_overheads)
    """Host overheads of the fine-tuning stacks' loops (`StackOverhead`, per `Layout.stack`:
    `cost_models.stacks`): a layout run in such a stack pays these in place of its framework's
    `Stack.step_s`. Fitted by bench/finetune_runs.py --fit (only these), after bench/fit_calibration.py
    (whose `Stack` constants price the stacks' kernels; it keeps these as stored)."""
    kernel_launch_s: float = 6e-6
    """Host seconds to launch one kernel from the training loop: the CUDA launch itself (2-4 us,
    CUDA C++ Best Practices Guide, "kernel launch overhead") plus the framework's dispatch of the
    op. A layer never runs faster than its kernels can be launched (`compute.layer_kernels`)."""
    # --- memory (priors, not fitted) ----------------------------------------------------------
    cuda_context_bytes: int = 768 * 2**20
    """CUDA context + cuBLAS/cuDNN workspaces outside the caching allocator (~0.5-1 GiB on Hopper,
    nvidia-smi minus torch.cuda.memory_reserved)."""
    fragmentation: float = 0.05
    """Caching-allocator reserved/allocated overhead as a fraction of allocated bytes (Megatron-Core,
    DeepSpeed: contiguous gradient and parameter buffers)."""
    fsdp_fragmentation: float = 0.10
    """The same under framework `fsdp` (FSDP2 / torchtitan: per-parameter sharded tensors, all-gather
    and reduce-scatter outputs of varying sizes). Measured peaks of torchtitan Llama-3.1-8B
    (`torchtitan_2412` rows: `torch.cuda.max_memory_reserved`) over the allocated bytes priced for
    them: 1.04-1.15, median 1.10 (eager above, torch.compile below)."""
    nccl_buffer_bytes_per_group: int = 64 * 2**20
    """GPU memory NCCL allocates per communicator (NCCL_BUFFSIZE 4 MiB x protocols x channels)."""
    source: str = "priors"

    def stack(self, framework: str) -> Stack:
        """The `Stack` constants of a stack (`stack_key`; Megatron's for an unknown one)."""
        s = self.stacks.get(framework)
        if s is None:
            s = self.stacks.get("megatron") or Stack()
        return s

    def step_overhead(self, framework: str) -> float:
        """Fixed seconds per step of a layout of `framework`: its stack's and the cluster's."""
        return self.stack(framework).step_s + self.step_overhead_s

    def fragmentation_of(self, framework: str) -> float:
        return self.fsdp_fragmentation if framework == "fsdp" else self.fragmentation

    def overlap(self, framework: str) -> Overlap:
        return self.overlaps.get(framework, self.overlaps["megatron"])

    def stack_overhead(self, stack: str) -> StackOverhead:
        return self.stack_overheads.get(stack) or _default_stack_overheads()[stack]

    def to_json(self) -> dict:
        d = asdict(self)
        return d

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        """Fields this version knows; unknown keys (of an older file) are ignored, missing ones
        keep their priors."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "overlaps" in kwargs:
            overlap_fields = {f.name for f in fields(Overlap)}
            kwargs["overlaps"] = {
                k: Overlap(**{f: x for f, x in v.items() if f in overlap_fields}) for k, v in kwargs["overlaps"].items()
            }
        if "stacks" in kwargs:
            stack_fields = {f.name for f in fields(Stack)}
            kwargs["stacks"] = {
                k: Stack(**{f: x for f, x in v.items() if f in stack_fields}) for k, v in kwargs["stacks"].items()
            }
        if "stack_overheads" in kwargs:
            overhead_fields = {f.name for f in fields(StackOverhead)}
            kwargs["stack_overheads"] = {
                k: StackOverhead(**{f: x for f, x in v.items() if f in overhead_fields})
                for k, v in kwargs["stack_overheads"].items()
            }
        return cls(**kwargs)


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    """The fitted calibration when `cost_models/data/calibration.json` exists, else the priors."""
    if FITTED_PATH.exists():
        data = json.loads(FITTED_PATH.read_text())
        return Calibration.from_json(data["calibration"])
    return Calibration()
