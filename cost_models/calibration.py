"""Every constant of the cost models that is not physics, in one place.

Physics (FLOP counts, bytes moved, datasheet peaks and bandwidths, collective algorithms) lives in
the other modules. What real software achieves of that physics is a fraction we cannot derive:
GEMM and attention kernel efficiency, the share of the catalog bus bandwidth NCCL reaches, how much
communication each framework hides behind compute. Those fractions are below.

They are *fitted*, not chosen: `bench/fit_calibration.py` fits them to
`data/calibration/published_runs.csv` on a training split and writes
`cost_models/data/calibration.json` together with the fit and hold-out errors. The defaults in
`Calibration` are the priors the fit starts from (sources in each field's comment); they are used
only when no fitted file exists.

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
    # ZeRO collectives reach (DeepSpeed ZeRO-3 gathers many small partitions, far below NCCL's peak)


@dataclass(frozen=True)
class StackOverhead:
    """Host seconds a fine-tuning stack's Python training loop costs (`cost_models.stacks`): per
    optimizer step (the optimizer's loop over parameters, zero_grad, scheduler, logging), per
    micro-batch (collate and copy the batch, loss scaling, metrics), and per kernel launched from
    its eager modules (the launch floor of `cost_models.compute`: op dispatch through Python module
    calls, PEFT's adapter wrappers among them)."""

    step_s: float = 0.0
    micro_batch_s: float = 0.0
    kernel_launch_s: float = 6e-6


def _default_stack_overheads() -> dict[str, StackOverhead]:
    # Priors (fitted by bench/finetune_runs.py --fit on data/calibration/finetune_runs.csv and the H200
    # runs of data/measurements/h200-2026-11): a PyTorch eager op costs 10-20 us of host time through
    # Python modules (PyTorch's "performance tuning guide": CPU-bound eager models; torch.compile's
    # motivation), a Python loop's micro-batch a few ms (Trainer.training_step: _prepare_inputs,
    # compute_loss, accelerator.backward), a step ~10 ms beside the optimizer's kernels.
    return {
        "hf": StackOverhead(step_s=0.01, micro_batch_s=0.005, kernel_launch_s=1.5e-5),
        "torchtune": StackOverhead(step_s=0.01, micro_batch_s=0.003, kernel_launch_s=1.0e-5),
    }


def _default_overlaps() -> dict[str, Overlap]:
    return {
        # Megatron-Core: --overlap-grad-reduce / --overlap-param-gather (bucket windows), TE
        # userbuffers for --tp-comm-overlap (Layout.tp_comm_overlap), batched p2p
        "megatron": Overlap(dp=1.0, zero3=1.0, tp=0.7, ep=0.0, pp=0.7),
        # PyTorch FSDP2 (torchtitan, llm-foundry): backward prefetch of one layer, no TP overlap
        # unless async TP is on
        "fsdp": Overlap(dp=1.0, zero3=1.0, tp=0.5, ep=0.0, pp=0.5),
        # DeepSpeed ZeRO: overlap_comm=true, less aggressive prefetch
        "deepspeed": Overlap(dp=0.8, zero3=0.7, tp=0.0, ep=0.0, pp=0.5),
    }


@dataclass(frozen=True, eq=False)
class Calibration:
    """Fitted constants. Compared and hashed by identity (it keys the pricing caches)."""

    # --- compute -------------------------------------------------------------------------------
    gemm_efficiency: float = 0.80
    """Fraction of the dense bf16 peak a large GEMM reaches (cuBLAS on H100 reaches 0.7-0.8 of
    989 TFLOP/s for 8k x 8k x 8k; NVIDIA's published GEMM benchmarks)."""
    fp8_gemm_efficiency: float = 0.65
    """Same for FP8 GEMMs relative to the FP8 peak (FP8 runs further from its peak)."""
    gemm_k_overhead: float = 128.0
    """Elements of k: a GEMM tile's prologue and epilogue cost as much as this many more elements of
    the reduction dimension (k efficiency k / (k + gemm_k_overhead), `cost_models.compute`); two
    64-deep mainloop iterations as a prior. Tile and wave quantization are geometry, not fitted."""
    attention_efficiency: float = 0.55
    """Fraction of the bf16 peak a fused attention kernel written for the GPU's own tensor cores
    reaches (`Layout.attention_kernel` "fused": Transformer Engine's cuDNN attention, FlashAttention-3;
    FlashAttention-2/3 papers: 50-75% of the peak in isolation)."""
    flash2_attention_efficiency: float = 0.55
    """Same for FlashAttention-2 (`Layout.attention_kernel` "flash2": the flash-attn 2 package and
    PyTorch's SDPA flash backend, which vendors it) on a GPU whose peak its warp-level mma.sync
    instructions reach (Ampere and older; FlashAttention-2 paper: 50-73% of the A100's peak)."""
    flash2_warpgroup_share: float = 0.5
    """Share of `flash2_attention_efficiency` FlashAttention-2 keeps on a GPU whose tensor-core peak
    needs warpgroup MMA (`GPUSpec.warpgroup_mma`: Hopper's wgmma, Blackwell's tcgen05), which its
    Ampere-era mma.sync kernels do not issue. Prior 0.5: FlashAttention-2 reaches 35% of the H100's
    peak (FlashAttention-3 paper, Shah et al. 2024, arXiv 2407.08608) where it reaches 50-73% of the
    A100's (FlashAttention-2 paper, Dao 2023, arXiv 2307.08691)."""
    hbm_efficiency: float = 0.80
    """Fraction of HBM bandwidth elementwise kernels and the optimizer step reach."""
    # --- communication -------------------------------------------------------------------------
    intra_bus_efficiency: float = 1.0
    """Multiplies the catalog's intra-node bus bandwidth (already an achievable nccl-tests figure)."""
    inter_bus_efficiency: float = 0.85
    """Multiplies the scale-out bus bandwidth (NICs' line rate -> NCCL busbw)."""
    overlaps: dict[str, Overlap] = field(default_factory=_default_overlaps)
    step_overhead_s: float = 0.0
    """Fixed seconds per optimizer step (launch, data loading, logging) not modelled elsewhere."""
    stack_overheads: dict[str, StackOverhead] = field(default_factory=_default_stack_overheads)
    """Host overheads of the fine-tuning stacks' loops (`StackOverhead`, `cost_models.stacks`), added to
    `step_overhead_s` for a layout with a `stack`. Fitted by bench/finetune_runs.py --fit (only these)."""
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
        if "stack_overheads" in kwargs:
            known_fields = {f.name for f in fields(StackOverhead)}
            kwargs["stack_overheads"] = {
                k: StackOverhead(**{f: x for f, x in v.items() if f in known_fields}) for k, v in kwargs["stack_overheads"].items()
            }
        return cls(**kwargs)


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    """The fitted calibration when `cost_models/data/calibration.json` exists, else the priors."""
    if FITTED_PATH.exists():
        data = json.loads(FITTED_PATH.read_text())
        return Calibration.from_json(data["calibration"])
    return Calibration()
