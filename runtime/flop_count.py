"""Measure the FLOPs of a training step of the reference model with PyTorch's own counter.

Ground truth for `cost_models.flops` (docs/architecture.md, "How we verify without a GPU", item 1): the
reference `Transformer` is built under `FakeTensorMode` (no memory, no compute) and one forward +
backward of the loss runs under `torch.utils.flop_counter.FlopCounterMode`.

Attention backends on the CPU build of torch 2.13 (see docs/verification-notes.md):
- "math": `sdpa_kernel(SDPBackend.MATH)` decomposes attention into two `bmm`s forward (QK^T, AV) and
  their gradients backward: 3 x forward, i.e. 12*S^2*d per layer for d_qk = d_v = d. This is the
  full-attention "model FLOPs" convention of `cost_models.flops.step_flops(...).model_flops`.
- "flash": the default CPU dispatch, `aten._scaled_dot_product_flash_attention_for_cpu` and its
  backward, which have no formula in torch (counted as 0). `register_cpu_flash_flop_formulas`
  registers PyTorch's `sdpa_flop_count` / `sdpa_backward_flop_count` for them: forward 4*S^2*d,
  backward 10*S^2*d (flash recomputes QK^T) = 14*S^2*d per layer. Neither halves for causal masks.
  The CPU flash kernel needs d_qk == d_v; otherwise (MLA) torch falls back to the math path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula

from model_specs.spec import ModelSpec
from runtime.model import build_model

Backend = Literal["math", "flash"]

_aten = torch.ops.aten


def register_cpu_flash_flop_formulas() -> None:
    """Give the CPU flash-attention ops (forward and backward) PyTorch's SDPA FLOP formulas.

    Idempotent (torch refuses duplicate registrations). Forward: `sdpa_flop_count` (QK^T + AV);
    backward: `sdpa_backward_flop_count` (recomputed QK^T, dV, dP, dQ, dK)."""
    fwd = _aten._scaled_dot_product_flash_attention_for_cpu
    bwd = _aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd not in flop_counter.flop_registry:

        @register_flop_formula(fwd)
        def _cpu_flash_fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    if bwd not in flop_counter.flop_registry:

        @register_flop_formula(bwd)
        def _cpu_flash_bwd(
            grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
        ) -> int:
            return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


@dataclass(frozen=True)
class MeasuredFlops:
    """FLOPs counted by `FlopCounterMode` for one forward + backward (whole model, whole batch)."""

    total: int
    by_op: dict[str, int] = field(default_factory=dict)  # aten op name -> FLOPs

    @property
    def attention(self) -> int:
        """FLOPs of SDPA ops (flash backend); the math backend's bmm are under "bmm"."""
        return sum(v for k, v in self.by_op.items() if "attention" in k)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def measure_step_flops(
    spec: ModelSpec,
    seq_len: int,
    batch: int = 1,
    *,
    backend: Backend = "math",
    dtype: torch.dtype = torch.bfloat16,
) -> MeasuredFlops:
    """Count forward + backward FLOPs of `build_model(spec).loss` on `batch` sequences of `seq_len`.

    Runs entirely under `FakeTensorMode` (MoE routing is then balanced, see `runtime.model.MoE`).
    `backend="math"` forces the math SDPA backend (model-FLOPs convention); "flash" uses the CPU
    flash kernel with the formulas of `register_cpu_flash_flop_formulas`."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "flash":
        register_cpu_flash_flop_formulas()
    kernel = sdpa_kernel(SDPBackend.MATH) if backend == "math" else nullcontext()
    with FakeTensorMode():
        with _default_dtype(dtype):
            model = build_model(spec)
        tokens = torch.randint(0, spec.vocab_size, (batch, seq_len))
        targets = torch.randint(0, spec.vocab_size, (batch, seq_len))
        counter = FlopCounterMode(display=False)
        with kernel, counter:
            model.loss(tokens, targets).backward()
    counts = counter.get_flop_counts().get("Global", {})
    by_op = {str(op).removeprefix("aten."): int(n) for op, n in counts.items()}
    return MeasuredFlops(int(counter.get_total_flops()), by_op)
