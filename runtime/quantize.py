"""QLoRA's 4-bit base: the frozen linear weights of the transformer layers stored as NF4 with double
quantization (Dettmers et al. 2023, Sec. 3), as torchao's `NF4Tensor` implements it: 4-bit NormalFloat
codes per element, one absmax per block of 64 elements, those absmaxes quantized to int8 with one
float32 factor per 256 of them: 0.5159 bytes per element, the cost model's
`TrainingSpec.quantized_weight_bytes` for `nf4_double` (measured on torchao 0.18: 0.51587).
`F.linear` on an NF4 weight dequantizes it to its original dtype first (torchao `linear_nf4`), as
bitsandbytes does, in the forward and the input-gradient GEMM of the backward.

Shard by shard, on the device: the runtime builds the model on the meta device, where each such
weight becomes a meta NF4 tensor (`quantize_linears`); `to_empty` gives it its 4-bit storage on the
rank's device, and the weight's values, drawn from the seed (`runtime.weights`) or read from a
checkpoint (`runtime.checkpoint`), pass through one 16-bit tensor at a time before they are
quantized into place (`store_`). The whole 16-bit base never exists. Embeddings, norms and the LM
head stay in the compute dtype (transformers' `BitsAndBytesConfig` skips the output layer and
bitsandbytes replaces `nn.Linear` only).

torchao is imported only when a run asks for qlora (`pip install torchao`; the `runtime` extra does
not carry it). Its NF4 needs each weight's element count to be a multiple of 64 x 256.
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.errors import NotSupportedError

__all__ = ["BLOCK", "SCALER_BLOCK", "is_quantized", "quantize_linears", "store_"]

BLOCK = 64
"""Elements per absmax block (QLoRA's and torchao's default)."""
SCALER_BLOCK = 256
"""Absmax values per float32 factor of the double quantization (QLoRA's and torchao's default)."""


def _nf4():  # type: ignore[no-untyped-def]
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor, to_nf4
    except ImportError as exc:
        raise NotSupportedError(
            "method qlora needs torchao's NF4Tensor for the 4-bit base (pip install torchao; the exports-check extra "
            "pins torchao==0.18.0)"
        ) from exc
    return NF4Tensor, to_nf4


def is_quantized(t: torch.Tensor) -> bool:
    """True for an NF4 weight (only when torchao is already imported: no import for plain runs)."""
    import sys

    if "torchao" not in sys.modules:
        return False
    nf4, _ = _nf4()
    return isinstance(t, nf4)


def _quantized_parameter(values: torch.Tensor) -> nn.Parameter:
    _, to_nf4 = _nf4()
    return nn.Parameter(to_nf4(values, BLOCK, SCALER_BLOCK), requires_grad=False)


def quantize_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Store the weight of every `nn.Linear` of `model.layers` (adapted or not) as NF4 of `dtype`
    values (meta weights become meta NF4 tensors; materialised ones are quantized now). Returns the
    number of weights quantized; NotSupportedError names a weight NF4 cannot block."""
    count = 0
    for name, mod in model.layers.named_modules(prefix="layers"):  # type: ignore[union-attr]
        if not isinstance(mod, nn.Linear):
            continue
        w = mod.weight
        if w.numel() % (BLOCK * SCALER_BLOCK):
            raise NotSupportedError(
                f"qlora: {name}.weight has {w.numel()} elements, not a multiple of {BLOCK} x {SCALER_BLOCK} "
                "(NF4 blocks and their double-quantization groups)"
            )
        mod.weight = _quantized_parameter(w.detach().to(dtype))
        count += 1
    return count


def store_(param: torch.Tensor, values: torch.Tensor) -> None:
    """Quantize `values` (the full weight, any float dtype) into the NF4 parameter `param`, in place
    (the parameter object is kept: `torch.utils.swap_tensors`)."""
    torch.utils.swap_tensors(param, _quantized_parameter(values.to(param.dtype)))
