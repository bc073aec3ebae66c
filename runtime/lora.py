"""LoRA adapters on the reference model (`TrainingSpec.method` "lora"; Hu et al. 2021).

`apply_lora(model, training)` freezes every parameter of the model (embedding, norms, biases,
router, LM head and every linear: `requires_grad=False`) and turns each linear that
`training.lora_modules` names into a `LoRALinear`, in place, with two trainable matrices:
A (r x in, Kaiming-uniform with a = sqrt(5), as PEFT's `LoraLayer.reset_lora_parameters`) and
B (out x r, zeros), and computes PEFT's `LoraLayer.forward` without dropout:

    y = base(x) + B(A(x)) * (alpha / r)          x: (..., in), y: (..., out)

so at initialisation (B = 0) the model computes exactly what the base model does. The base
weight keeps its name (`attention.wq.weight`); the adapters are `attention.wq.lora_A` and
`attention.wq.lora_B` (elements: r x in and out x r; fp32 master copies, the optimizer's only
parameters). With `base_dtype` (the run's compute dtype, bf16 on GPU) the frozen base is stored
in that dtype, as `cost_models` prices a LoRA run ("base weights frozen in the compute dtype"):
2 bytes per frozen element instead of 4.

PEFT module names (`model_specs.spec.LORA_MODULE_NAMES`) -> reference modules (`runtime.model`):

    standard attention     q_proj -> attention.wq, k_proj -> attention.wk, v_proj -> attention.wv,
                           o_proj -> attention.wo (q, k and v are separate linears: no fused qkv)
    MLA (DeepSeek)         q_a_proj -> attention.wq_a, q_b_proj -> attention.wq (with q_lora_rank),
                           q_proj -> attention.wq (without), kv_a_proj_with_mqa -> attention.wkv_a,
                           kv_b_proj -> attention.wkv_b, o_proj -> attention.wo
    gated MLP (swiglu,     gate_proj -> w1, up_proj -> w3, down_proj -> w2 (HF: down(act(gate x) * up x))
      geglu)
    two-matrix MLP         up_proj -> w1, down_proj -> w2 (`model_specs.params` names them so)

The MLP names apply to dense `FeedForward` layers and to an MoE layer's shared experts. The
router, the shared-expert gate and the LM head are never adapted (PEFT's all-linear leaves them).
Names the model does not have are ignored (PEFT does the same per module); a target list that
matches no linear at all raises ValueError. The adapted modules and their (in, out) features are
exactly `model_specs.params.layer_linears`' entries of the same names, so the trainable elements
equal `model_specs.params.trainable_counts(spec, "lora", modules, rank).trainable` (tested).

Method qlora: the same adapters, and every linear weight of the layers (adapted or not) stored as
NF4 with double quantization (`runtime.quantize`, torchao's NF4Tensor), quantized one weight at a
time on the device as its values are drawn or loaded.

Not supported (raise `NotSupportedError`):
- qlora with quant_format nf4 or int8 (torchao's NF4 is double-quantized), on a model with routed
  experts (their 3-D weights are not linears), or with data parallelism (`runtime.parallelize`).
- MLP targets (gate_proj, up_proj, down_proj) on a model with routed experts: `GroupedExperts`
  holds its experts as 3-D tensors and runs them inside one module, so per-expert adapters have
  no linear to wrap. Attention-only targets (`lora_targets="attention"`) work on MoE models.
- tensor parallelism (tp > 1): the adapters would need their own column / row plans;
  `runtime.parallelize` refuses the combination.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model_specs.spec import LORA_MLP_NAMES, TrainingSpec
from runtime.model import Attention, FeedForward, MLAttention, MoE, NotSupportedError, Transformer
from runtime.weights import SeededInit, is_symbolic

__all__ = ["MLP_TARGETS", "LoRALinear", "apply_lora", "module_map"]

MLP_TARGETS = LORA_MLP_NAMES


class LoRALinear(nn.Linear):
    """An `nn.Linear` (frozen base) with a LoRA adapter: `base(x) + B(A(x)) * scaling` (module doc).

    Made from an existing linear by `LoRALinear.adapt(linear, ...)` (in place: the base weight
    and bias keep their parameter objects and names). `lora_A`: (r, in); `lora_B`: (out, r);
    `scaling` = alpha / r; `peft_name`: the PEFT module name it answers to. The adapters' values
    come from `init_adapters` (on a model built on the meta device, after its shards exist)."""

    lora_A: nn.Parameter
    lora_B: nn.Parameter
    scaling: float
    peft_name: str

    @classmethod
    def adapt(cls, linear: nn.Linear, rank: int, alpha: float, peft_name: str) -> LoRALinear:
        """Turn `linear` into a LoRALinear in place (its class is swapped) and return it. The
        adapters are fp32 on the base weight's device, their values left to `init_adapters`."""
        device = linear.weight.device
        linear.__class__ = cls
        lin: LoRALinear = linear  # type: ignore[assignment]
        lin.lora_A = nn.Parameter(torch.empty(rank, lin.in_features, device=device, dtype=torch.float32))
        lin.lora_B = nn.Parameter(torch.empty(lin.out_features, rank, device=device, dtype=torch.float32))
        lin.scaling = alpha / rank
        lin.peft_name = peft_name
        return lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., in) -> (..., out). The adapter computes in x's dtype (FSDP's mixed precision
        casts every parameter to it; under autocast F.linear picks the autocast dtype)."""
        a, b = self.lora_A, self.lora_B
        if a.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
            a, b = a.to(x.dtype), b.to(x.dtype)
        return super().forward(x) + F.linear(F.linear(x, a), b) * self.scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lora_rank={self.lora_A.shape[0]}, scaling={self.scaling:g}, peft={self.peft_name}"


def init_adapters(model: nn.Module, init: SeededInit) -> None:
    """A uniform on +-1/sqrt(in) (PEFT: `kaiming_uniform_(a=sqrt(5))`, nn.Linear's default, whose
    bound is gain x sqrt(3 / in) with gain sqrt(2 / (1 + 5))) and B zero, for every adapter of
    `model`, drawn by `init` (`runtime.weights`: by global name, whatever the layout)."""
    for m in model.modules():
        if isinstance(m, LoRALinear):
            bound = 1.0 / math.sqrt(m.in_features)
            init.uniform_(m.lora_A, -bound, bound)
            init.zeros_(m.lora_B)


def module_map(module: nn.Module) -> dict[str, str]:
    """PEFT module name -> attribute name of the linear it means in `module` (an attention or a
    dense MLP of the reference model; module doc). Empty for any other module."""
    if isinstance(module, Attention):
        return {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo"}
    if isinstance(module, MLAttention):
        q = {"q_a_proj": "wq_a", "q_b_proj": "wq"} if module.wq_a is not None else {"q_proj": "wq"}
        return {**q, "kv_a_proj_with_mqa": "wkv_a", "kv_b_proj": "wkv_b", "o_proj": "wo"}
    if isinstance(module, FeedForward):
        if module.w3 is not None:
            return {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
        return {"up_proj": "w1", "down_proj": "w2"}
    return {}


def _cast_frozen(model: nn.Module, dtype: torch.dtype) -> None:
    """Store every frozen floating-point parameter in `dtype` (tied weights stay tied)."""
    memo: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or p.requires_grad or not p.is_floating_point() or p.dtype == dtype:
                continue
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=False)
            mod._parameters[name] = memo[id(p)]


def apply_lora(model: Transformer, training: TrainingSpec, base_dtype: torch.dtype | None = None) -> list[LoRALinear]:
    """Freeze `model` and add adapters per `training` (module doc); returns the adapted linears.
    A no-op (returns []) for method "full". `base_dtype`: store the frozen base in this dtype
    (default: keep it). Call it on the whole model before pipeline cuts and parallel wrappers."""
    if not training.frozen_base:
        return []
    if training.method == "qlora":
        if training.quant_format_ != "nf4_double":
            raise NotSupportedError(
                f"method qlora with quant_format {training.quant_format_!r}: the runtime stores the base as NF4 with "
                "double quantization (torchao's NF4Tensor) only: quant_format nf4_double"
            )
        if any(isinstance(m, MoE) for m in model.modules()):
            raise NotSupportedError(
                "method qlora on a model with routed experts: GroupedExperts' 3-D weights are not nn.Linear, so they "
                "would stay 16-bit where the plan priced them as NF4"
            )
    targets = set(training.lora_modules)
    if targets & set(MLP_TARGETS) and any(isinstance(m, MoE) for m in model.modules()):
        raise NotSupportedError(
            f"LoRA on the MLP ({', '.join(sorted(targets & set(MLP_TARGETS)))}) of a model with routed experts is "
            "not implemented: GroupedExperts runs its 3-D expert weights inside one module; "
            "target attention only (lora_targets='attention')"
        )
    for p in model.parameters():
        p.requires_grad_(False)
    rank, alpha = training.lora_rank_, training.lora_alpha_
    adapted: list[LoRALinear] = []
    for mod in list(model.modules()):
        for peft_name, attr in module_map(mod).items():
            lin = getattr(mod, attr, None)
            if peft_name in targets and isinstance(lin, nn.Linear) and not isinstance(lin, LoRALinear):
                adapted.append(LoRALinear.adapt(lin, rank, alpha, peft_name))
    if not adapted:
        raise ValueError(
            f"lora_targets {sorted(targets)} match no linear of model {model.spec.name} "
            f"(its attention is {model.spec.attention}, its MLP {model.spec.mlp})"
        )
    if base_dtype is not None:
        _cast_frozen(model, base_dtype)
    if training.method == "qlora":
        from runtime.quantize import quantize_linears

        quantize_linears(model, base_dtype or adapted[0].weight.dtype)
    if not is_symbolic(adapted[0].weight):
        init_adapters(model, SeededInit.of(model))  # a materialised model: draw the adapters now
    return adapted
