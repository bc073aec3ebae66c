"""Context parallelism with explicit collectives, so it runs (and is tested) on gloo.

The sequence is cut into `2 * cp` equal chunks; CP rank r holds chunks r and 2cp-1-r (the
load-balanced causal split of Megatron-Core and Llama 3: every rank gets one early and one late
chunk, so causal attention work is even). Every rank embeds and runs its own tokens; attention
all-gathers K and V over the CP group (as Llama 3 trained; autograd turns the all-gather into a
reduce-scatter of dK/dV in backward) and masks by true positions. The keys are left in gathered
order: softmax does not care about key order, only the mask does.

torch's experimental `context_parallel` (ring attention) has no CPU sharding strategy for the
attention op, hence this implementation; on GPU it is a candidate replacement.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["apply_context_parallel", "cp_attention", "cp_positions"]


def cp_positions(seq_len: int, cp: int, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Global positions of the tokens CP rank `rank` holds: chunks `rank` and `2cp-1-rank`."""
    if cp == 1:
        return torch.arange(seq_len, device=device)
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len {seq_len} is not divisible by 2 x cp = {2 * cp}")
    c = seq_len // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat(
        [torch.arange(first * c, (first + 1) * c, device=device), torch.arange(second * c, (second + 1) * c, device=device)]
    )


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mesh: DeviceMesh,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    window: int | None = None,
    chunked: bool = False,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of local queries over all keys of the CP group.

    q: (B, H, s, dq) local; k, v: (B, K, s, d) local. `q_pos` (s,) and `k_pos` (cp*s,) are the
    global positions of the local queries and of the gathered keys. Same semantics as
    `runtime.model.attention_core` (window or chunk, ALiBi, sinks). Returns (B, H, s, dv).
    """
    # imported here: the name is new in torch 2.13 (the pinned version) and the rest of the
    # runtime also runs on older GPU images, where only context parallel needs it
    from torch.distributed._functional_collectives import all_gather_single_autograd

    k = all_gather_single_autograd(k.contiguous(), 2, mesh)
    v = all_gather_single_autograd(v.contiguous(), 2, mesh)
    gqa = q.shape[1] != k.shape[1]
    dist = q_pos[:, None] - k_pos[None, :]  # query - key
    allowed = dist >= 0
    if window is not None:
        allowed = allowed & ((q_pos[:, None] // window == k_pos[None, :] // window) if chunked else (dist < window))
    if alibi is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=gqa)
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=q.device).masked_fill(~allowed, float("-inf"))
    if alibi is not None:
        bias = bias[None] - alibi.to(q.device, torch.float32)[:, None, None] * dist.clamp(min=0)[None]
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale, enable_gqa=gqa)
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + bias
    sink_col = sinks.float().reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    probs = torch.cat([scores, sink_col], dim=-1).softmax(dim=-1)[..., :-1].to(v.dtype)
    return torch.matmul(probs, v)


def apply_context_parallel(model: torch.nn.Module, mesh: DeviceMesh, seq_len: int, device: torch.device) -> None:
    """Swap the attention kernel of every layer of `model` for `cp_attention` over `mesh`."""
    cp, rank = mesh.size(), mesh.get_local_rank()
    q_pos = cp_positions(seq_len, cp, rank, device)
    k_pos = torch.cat([cp_positions(seq_len, cp, r, device) for r in range(cp)])
    for layer in model.layers.values():  # type: ignore[union-attr]
        attn = layer.attention
        if attn.window is not None and attn.window >= seq_len:
            attn.window = None
        attn.core = partial(cp_attention, mesh=mesh, q_pos=q_pos, k_pos=k_pos)
