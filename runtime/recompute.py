"""Activation recompute: full (per layer), selective (attention core + MLP activation) and op-level
selective checkpointing (`op_sac`, torchtitan's default).

- `full`: each selected transformer block is wrapped in `checkpoint_wrapper` (non-reentrant
  `torch.utils.checkpoint`): only the block input is kept; the block's forward runs again in
  backward. `recompute_layers = n` recomputes the first n layers a pipeline rank holds (in the
  order `StagePartition.rank_layers` lists them), as `cost_models` prices it.
- `selective` (cost_models/activations.py semantics, Megatron-Core `recompute_modules=[core_attn,
  mlp act]`): the attention core (scores, softmax, weighted sum and head merge) and the MLP
  activation (act(w1 x) * w3 x) keep only their inputs (Q, K, V and the two fc1 outputs); their
  outputs are dropped after the output projection (wo, w2) has consumed them and recomputed right
  before that projection's backward, like Megatron's `CheckpointWithoutOutput`. No GEMM is
  recomputed. The output projection saves its input by reference, so the output's storage is
  freed (`resize_(0)`) and refilled in place before it is read again.
  Routed experts of MoE layers are not covered (their activation runs per expert inside
  `GroupedExperts`); shared experts are (they are `FeedForward`s).
- `op_sac` (`cost_models/op_sac.py` semantics, torchtitan `selective_ac_option="op"`): every block
  is checkpointed with a selective-checkpoint policy (`torch.utils.checkpoint.
  create_selective_checkpoint_contexts`): outputs of matmuls are saved except every second one of
  the block, outputs of the attention kernel are saved, everything else is recomputed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from runtime.model import Attention, FeedForward, MLAttention, _is_symbolic, run_region

__all__ = ["apply_recompute", "selective_region"]


class _Region:
    """State shared by the forward, the recompute hook and the backward of one region call."""

    def __init__(self, fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor | None]):
        self.fn = fn
        self.inputs = [t.detach() if t is not None else None for t in inputs]
        self.needs_grad = [t is not None and t.requires_grad for t in inputs]
        self.output: torch.Tensor | None = None  # detached alias of the region output
        self.recomputed: tuple[torch.Tensor, list[torch.Tensor | None]] | None = None

    def recompute(self) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        if self.recomputed is None:
            ins = [
                t.detach().requires_grad_(g) if t is not None else None
                for t, g in zip(self.inputs, self.needs_grad, strict=True)
            ]
            with torch.enable_grad():
                out = self.fn(*ins)
            self.recomputed = (out, ins)
            if self.output is not None:  # refill the freed storage (no version bump)
                st = self.output.untyped_storage()
                st.resize_(out.untyped_storage().nbytes())
                if not _is_symbolic(out):  # fake tensors have no data (and the copy's
                    st.copy_(out.detach().untyped_storage())  # temporaries would pin them)
        return self.recomputed

    def discard_output(self, consumer_out: torch.Tensor) -> None:
        out = self.output
        if out is None or not consumer_out.requires_grad:
            return
        st = out.untyped_storage()
        if not out.is_contiguous() or out.storage_offset() != 0 or st.nbytes() != out.numel() * out.element_size():
            self.output = None  # a view into something larger: keep it
            return
        st.resize_(0)
        consumer_out.register_hook(lambda g: self._before_consumer_backward(g))

    def _before_consumer_backward(self, grad: torch.Tensor) -> None:
        self.recompute()


class _RegionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, state: _Region, *inputs: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        ctx.state = state
        with torch.no_grad():
            out = state.fn(*inputs)
        state.output = out.detach()
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        state: _Region = ctx.state
        out, ins = state.recompute()
        # Drop every reference now: the graph nodes (and this state) live on until the loss
        # tensor is released, which may be after the next forward.
        state.recomputed = state.output = None
        state.inputs = []
        diff = [(o, g) for o, g in [(out, grad)] if o.requires_grad]
        if diff:
            torch.autograd.backward([o for o, _ in diff], [g for _, g in diff])
        return (None, *[t.grad if t is not None and t.requires_grad else None for t in ins])


def selective_region(fn: Callable[..., torch.Tensor], inputs: tuple, consumer: nn.Module) -> torch.Tensor:
    """`consumer(fn(*inputs))`, keeping only `inputs` of the region for backward (see module doc)."""
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in inputs):
        return run_region(fn, inputs, consumer)
    state = _Region(fn, inputs)
    out = _RegionFunction.apply(state, *inputs)
    y = consumer(out)
    state.discard_output(y)
    return y


def _attention_ops() -> set[Any]:
    ops = set()
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ):
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            ops.add(packet.default)
    return ops


def op_sac_context() -> tuple[Any, Any]:
    """The (forward, recompute) contexts of one checkpointed block call under op-level SAC (module
    doc): a fresh matmul counter per call, so "every second matmul" restarts in each block."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts = {False: 0, True: 0}
    attention = _attention_ops()
    mm = torch.ops.aten.mm.default

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if func == mm:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.MUST_SAVE if func in attention else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_recompute(
    model: nn.Module, mode: str, layer_ids: Sequence[int] | None = None
) -> None:
    """Apply `mode` (none|selective|full|op_sac) to `model`'s blocks. `layer_ids`: the global indices of
    the blocks full recompute covers (default: all)."""
    if mode == "none":
        return
    layers: nn.ModuleDict = model.layers  # type: ignore[assignment]
    if mode == "op_sac":
        for key in list(layers.keys()):
            layers[key] = checkpoint_wrapper(
                layers[key], preserve_rng_state=False, context_fn=functools.partial(op_sac_context)
            )
        return
    if mode == "full":
        chosen = {str(i) for i in layer_ids} if layer_ids is not None else set(layers.keys())
        for key in list(layers.keys()):
            if key in chosen:
                layers[key] = checkpoint_wrapper(layers[key], preserve_rng_state=False)
        return
    if mode != "selective":
        raise ValueError(f"unknown recompute mode {mode!r}")
    for m in model.modules():
        if isinstance(m, (Attention, MLAttention, FeedForward)):
            m.run_region = selective_region
