"""What a training method changes in the price of a layer: LoRA and QLoRA (`TrainingSpec.method`).

Sources and formulas (each used once, here):
- LoRA (Hu et al. 2021, Sec. 4): an adapted linear W (out x in) gets A (r x in) and B (out x r);
  W is frozen, A and B are trained: r x (in + out) trainable parameters per module
  (`model_specs.params.adapter_params`). PEFT's `LoraLayer.forward` runs
  `result = base(x) + lora_B(lora_A(dropout(x))) * scaling`.
- Frozen weights have no gradient and no optimizer state; the backward still computes the input
  gradient through them (one GEMM per forward GEMM) but no weight gradient: a frozen GEMM's
  backward is one forward's FLOPs instead of two. ZeRO-3 / FSDP still shards and gathers the frozen
  base (DeepSpeed ZeRO-3 partitions every parameter; FSDP2 shards the whole module), while
  gradient reduction carries only the adapters.
- QLoRA (Dettmers et al. 2023): the base linears are stored as 4-bit NormalFloat with
  double-quantized constants (`TrainingSpec.quantized_weight_bytes`: 0.5159 bytes per element)
  or int8; embeddings, norms and the LM head stay in the compute dtype (transformers'
  `BitsAndBytesConfig` skips the output layer, bitsandbytes replaces `nn.Linear` only). Each use of
  a quantized weight (forward, and the input-gradient GEMM of the backward: bitsandbytes'
  `MatMul4Bit.backward` dequantizes again) first dequantizes it to a 16-bit copy: it reads the
  packed weight and writes the copy (HBM traffic), and the copy of the largest linear is a transient.

Adapter kernels are skinny GEMMs (r of 8-64): memory-bound, priced by the HBM elements they move
per token. PEFT's eager forward reads the input (in), writes B's output (out), scales it (read +
write out) and adds it to the base output (two reads and a write of out): in + 6 x out. Its
backward scales the output gradient (read + write out), reads it for B's input and weight
gradients (2 x out), writes A's input gradient (in), reads the input for A's weight gradient (in)
and adds the input gradient to the base's (two reads and a write of in): 5 x in + 4 x out. Four
kernel launches forward. The r-wide intermediates are left out (r / h < 1%).
So adapters cost about as much HBM time as the weight-gradient GEMMs they spare on a 4096-wide
model at 4k tokens per micro-batch, and much less on wide ones (GEMM work grows with h^2, adapter
traffic with h): the LoRA paper measured a 25% speed-up on GPT-3 175B (Hu et al. 2021, Sec. 4.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from cost_models.mesh import Scalars
from cost_models.stacks import adapter_input_bytes
from model_specs.params import Linear, adapter_params, layer_linears
from model_specs.spec import ModelSpec, TrainingSpec

ADAPTER_KERNELS = 4
"""Kernels one adapted module launches in the forward (A GEMM, B GEMM, scale, add; PEFT)."""
ADAPTER_ELEMENTS_IN, ADAPTER_ELEMENTS_OUT = 1, 6
"""HBM elements per token an adapter's forward moves per input feature and per output feature."""
ADAPTER_BACKWARD_IN, ADAPTER_BACKWARD_OUT = 5, 4
"""The same for its backward (module doc)."""
FP32_ADAPTER_BYTES = (10.0, 28.0, 20.0, 22.0)
"""HBM bytes per token an adapter with float32 weights moves over a bf16 base, per input and output
feature, forward then backward: PEFT's `LoraLayer.forward` casts the input to float32 (read 2, write
4), A reads it (4), B writes its float32 output (4), `* scaling` reads and writes it (8), the add to
the bf16 base output promotes to float32 (read 2 + 4, write 4) and `result.to(torch_result_dtype)`
casts back (read 4, write 2): 10 per input and 28 per output feature. The backward casts the bf16
output gradient up (6), scales it (8), B reads it for its two gradients (8), A writes its float32
input gradient (4) and reads the saved input (4), the cast down (6) and the add to the base's input
gradient (6): 20 per input and 22 per output feature."""
FP32_ADAPTER_KERNELS = 6
"""Kernels a float32 PEFT adapter launches in the forward (cast, A, B, scale, add, cast back)."""
DORA_WEIGHT_BYTES = 26.0
"""HBM bytes per weight element DoRA's weight norm moves in every forward, per adapted module (PEFT
`DoraLinearLayer.get_weight_norm` on a bf16 base with float32 adapters): the base weight cast to the
adapters' dtype (read 2, write 4), B @ A written (4), W + s BA (read 8, write 4) and its row norm
(read 4). The norm is detached (DoRA paper, Sec. 4.3), so the backward does not repeat it."""
DORA_OUTPUT_BYTES = (24.0, 24.0)
"""HBM bytes per token and output feature of DoRA's output combination, forward and backward
(`(mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * scaling` in float32: three
reads and three writes of the output; the backward's magnitude gradient reads the saved base and
adapter outputs again)."""
DORA_SAVED_BYTES = 12.0
"""Bytes per token and output feature DoRA keeps for backward beyond LoRA's: the float32 base output
and adapter output its magnitude gradient reads, and the scaled product (measured on CPU with PEFT
0.21.2 and saved-tensor hooks, q_proj and v_proj adapted: 12 bytes per output feature and token)."""
DEQUANT_KERNELS = 1
"""Kernels one quantized linear launches per use to dequantize its weight (bitsandbytes)."""


@dataclass(frozen=True)
class FineTune:
    """A training method with a frozen base, as the cost model needs it (hashable: caches key on it).

    `rank`, `modules`: the adapters; `base_bytes`: bytes per stored element of a frozen *linear*
    weight (the compute dtype's for lora, `TrainingSpec.quantized_weight_bytes` for qlora);
    `compute_bytes`: bytes of the compute dtype (non-linear weights, adapters, dequantized copies)."""

    rank: int
    modules: tuple[str, ...]
    base_bytes: float
    compute_bytes: int
    quantized: bool
    fp32_adapters: bool = False  # PEFT's float32 adapters over a 16-bit base (`cost_models.stacks`)
    dora: bool = False

    @classmethod
    def of(cls, training: TrainingSpec, stack: str | None = None) -> FineTune | None:
        if not training.frozen_base:
            return None
        fp32 = adapter_input_bytes(training, stack)[1]
        # an FP8-stored base under FP8 compute is read by the FP8 GEMMs as it is: nothing to dequantize
        quantized = training.method == "qlora" and not (training.quant_format_ == "fp8" and training.precision == "fp8")
        return cls(
            training.lora_rank_, training.lora_modules, training.quantized_weight_bytes, training.param_bytes,
            quantized, fp32, training.dora,
        )

    def adapted(self, linear: Linear) -> bool:
        return linear.name in self.modules


def _split(linear: Linear, tp: Scalars, etp: Scalars) -> tuple[Scalars, Scalars]:
    """(in, out) features of `linear` on one rank (tensor / expert-tensor parallel cut)."""
    degree = etp if linear.expert else tp
    if linear.split == "column":
        return linear.in_features, linear.out_features / degree
    if linear.split == "row":
        return linear.in_features / degree, linear.out_features
    return float(linear.in_features), float(linear.out_features)


def _copies(linear: Linear, ep: Scalars) -> Scalars:
    """Modules of `linear` one rank holds: all of them, or its share of the routed experts."""
    return linear.count / ep if linear.expert else float(linear.count)


@dataclass(frozen=True)
class LayerState:
    """Per-rank weights of one layer under a method, in elements (arrays when the degrees are)."""

    dense_linear: Scalars  # linear weights outside routed experts (per-rank convention below)
    expert_linear: Scalars  # the routed experts' weights
    dense_adapters: Scalars  # trainable adapter elements, dense part
    expert_adapters: Scalars  # trainable adapter elements of routed experts
    largest_linear: Scalars  # the largest single linear weight on the rank


def layer_state(model: ModelSpec, index: int, tp: Scalars, ep: Scalars, etp: Scalars, ft: FineTune) -> LayerState:
    """Per-rank linear and adapter elements of layer `index`. Linear weights follow the stage
    table's convention (attention, MLP and shared experts divided by tp, the router whole, routed
    experts divided by ep x etp); an adapter's A and B are cut as its module is (a column-parallel
    module's A is replicated and its B split; a row-parallel one's A split and B replicated).
    Degrees may be arrays (the planner's shard geometries): every field is then an array."""
    dense_linear: Scalars = 0.0
    expert_linear: Scalars = 0.0
    dense_ad: Scalars = 0.0
    expert_ad: Scalars = 0.0
    largest: Scalars = 0.0
    for x in layer_linears(model, index):
        elements = float(x.in_features * x.out_features)
        if x.expert:
            per_rank = elements / etp
            expert_linear = expert_linear + per_rank * _copies(x, ep)
        else:
            per_rank = elements if x.split == "replicated" else elements / tp
            dense_linear = dense_linear + per_rank * x.count
        largest = np.maximum(largest, per_rank)
        if ft.adapted(x):
            fin, fout = _split(x, tp, etp)
            ad = ft.rank * (fin + fout) * _copies(x, ep)
            if x.expert:
                expert_ad = expert_ad + ad
            else:
                dense_ad = dense_ad + ad
    return LayerState(dense_linear, expert_linear, dense_ad, expert_ad, largest)


def linear_elements(model: ModelSpec, index: int, tp: Scalars, ep: Scalars, etp: Scalars) -> Scalars:
    """Per-rank elements of layer `index`'s linear weights, cut as `layer_state` cuts them (attention,
    MLP and shared experts over tp, the router whole, routed experts over ep x etp)."""
    total: Scalars = 0.0
    for x in layer_linears(model, index):
        elements = float(x.in_features * x.out_features)
        if x.expert:
            total = total + elements / etp * _copies(x, ep)
        else:
            total = total + (elements if x.split == "replicated" else elements / tp) * x.count
    return total


def adapter_seconds(
    model: ModelSpec, index: int, tokens: object, tp: object, ep: object, etp: object, act_bytes: int,
    bandwidth: float, ft: FineTune,
) -> tuple[object, object]:
    """Seconds of one layer's adapters in the forward and in the backward on one rank (memory-bound,
    module doc).
    `tokens`: tokens of the micro-batch through the layer's dense linears (the gathered sequence
    under sequence parallelism); routed experts see `tokens x top_k / ep`. Arrays broadcast."""
    total: object = 0.0
    backward: object = 0.0
    for x in layer_linears(model, index):
        if not ft.adapted(x):
            continue
        fin, fout = _split(x, tp, etp)  # type: ignore[arg-type]
        through: Any
        if x.expert:
            through = tokens * model.moe_top_k / ep  # type: ignore[operator]
            copies = 1.0  # tokens are spread over the rank's experts
        else:
            through, copies = tokens, float(x.count)
        if ft.fp32_adapters:
            fi, fo, bi, bo = FP32_ADAPTER_BYTES
            fwd = copies * through * (fi * fin + fo * fout)  # type: ignore[operator]
            bwd = copies * through * (bi * fin + bo * fout)  # type: ignore[operator]
        else:
            fwd = copies * through * (ADAPTER_ELEMENTS_IN * fin + ADAPTER_ELEMENTS_OUT * fout) * act_bytes  # type: ignore[operator]
            bwd = copies * through * (ADAPTER_BACKWARD_IN * fin + ADAPTER_BACKWARD_OUT * fout) * act_bytes  # type: ignore[operator]
        if ft.dora:
            weight = fin * fout * (copies if not x.expert else _copies(x, ep))  # type: ignore[operator, arg-type]
            fwd = fwd + DORA_WEIGHT_BYTES * weight + copies * through * DORA_OUTPUT_BYTES[0] * fout  # type: ignore[operator]
            bwd = bwd + copies * through * DORA_OUTPUT_BYTES[1] * fout  # type: ignore[operator]
        total = total + fwd / bandwidth  # type: ignore[operator]
        backward = backward + bwd / bandwidth  # type: ignore[operator]
    return total, backward


def adapter_kernels(model: ModelSpec, index: int, ft: FineTune) -> float:
    """Extra kernels one layer's forward launches: adapters, and dequantizations under qlora
    (grouped routed experts launch one kernel per module kind, as their GEMMs do)."""
    n = 0.0
    for x in layer_linears(model, index):
        copies = 1 if x.expert else x.count
        if ft.adapted(x):
            n += (FP32_ADAPTER_KERNELS if ft.fp32_adapters else ADAPTER_KERNELS) * copies
            if ft.dora:
                n += 6 * copies  # B @ A, the weight cast, W + s BA, its norm, the two output combinations
        if ft.quantized:
            n += DEQUANT_KERNELS * copies
    return n


@lru_cache(maxsize=256)
def adapter_params_per_token(model: ModelSpec, ft: FineTune | None) -> float:
    """Adapter elements one token passes through in the whole model (`params.adapter_params`)."""
    if ft is None:
        return 0.0
    return float(sum(adapter_params(model, i, ft.modules, ft.rank, per_token=True) for i in range(model.num_layers)))


def frozen_weight_bytes(params: float, linear: float, ft: FineTune) -> float:
    """Stored bytes of `params` elements of which `linear` are linear weights: the linears at the
    method's base bytes, the rest (norms, biases, embedding, head) at the compute dtype's."""
    return ft.compute_bytes * (params - linear) + ft.base_bytes * linear
