"""Reference model (runtime/model.py): parameter counts, numerics of each attention/MLP variant,
pipeline-stage surgery, and a few real AdamW steps on CPU."""

from __future__ import annotations

import importlib.util
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from model_specs.params import count_params  # noqa: E402
from model_specs.spec import ModelSpec  # noqa: E402
from runtime.model import (  # noqa: E402
    MoE,
    NotSupportedError,
    alibi_slopes,
    attention_core,
    build_model,
    num_params,
)

V = 512
SPECS: dict[str, ModelSpec] = {
    "dense-gqa": ModelSpec(
        vocab_size=V, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_hidden_size=160
    ),
    "gpt2-like": ModelSpec(
        family="gpt2",
        vocab_size=V,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        ffn_hidden_size=256,
        mlp="gelu",
        norm="layernorm",
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        tie_embeddings=True,
        position_embedding="learned",
        max_position_embeddings=64,
    ),
    "moe-shared": ModelSpec(
        family="qwen2_moe",
        vocab_size=V,
        hidden_size=64,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=128,
        qkv_bias=True,
        num_experts=8,
        moe_top_k=2,
        moe_ffn_hidden_size=32,
        num_shared_experts=2,
        shared_expert_ffn_hidden_size=48,
        shared_expert_gate=True,
        first_k_dense_layers=1,
    ),
    "mla-moe": ModelSpec(
        family="deepseek_v3",
        vocab_size=V,
        hidden_size=64,
        num_layers=3,
        num_heads=4,
        ffn_hidden_size=128,
        attention="mla",
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=12,
        num_experts=8,
        moe_top_k=3,
        moe_ffn_hidden_size=24,
        num_shared_experts=1,
        first_k_dense_layers=1,
        router_score_correction_bias=True,
    ),
    "mla-no-qlora": ModelSpec(
        family="deepseek_v2",
        vocab_size=V,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        ffn_hidden_size=128,
        attention="mla",
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        attn_out_bias=True,
    ),
    "gpt-oss-like": ModelSpec(
        family="gpt_oss",
        vocab_size=V,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        ffn_hidden_size=64,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        attention_sinks=True,
        sliding_window=4,
        sliding_window_every=2,
        num_experts=4,
        moe_top_k=2,
        moe_ffn_hidden_size=32,
        router_bias=True,
    ),
    "qwen3-like": ModelSpec(
        family="qwen3",
        vocab_size=V,
        hidden_size=64,
        num_layers=2,
        num_heads=8,
        num_kv_heads=1,
        head_dim=16,
        ffn_hidden_size=96,
        mlp="geglu",
        qk_norm=True,
        tie_embeddings=True,
    ),
    "alibi-neox": ModelSpec(
        family="bloom",
        vocab_size=V,
        hidden_size=48,
        num_layers=2,
        num_heads=6,
        ffn_hidden_size=96,
        mlp="relu2",
        norm="layernorm",
        position_embedding="alibi",
        parallel_residual=True,
    ),
    "gemma2-like": ModelSpec(  # sandwich norms, per-head q/k norms (Gemma 3), local layers every other
        family="gemma2",
        vocab_size=V,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        ffn_hidden_size=96,
        mlp="geglu",
        qk_norm=True,
        norm_placement="sandwich",
        tie_embeddings=True,
        sliding_window=4,
        sliding_window_every=2,
    ),
    "olmo2-like": ModelSpec(  # post norms, q/k norms over the whole projections
        family="olmo2",
        vocab_size=V,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=96,
        qk_norm=True,
        qk_norm_scope="projection",
        norm_placement="post",
    ),
    "llama4-like": ModelSpec(  # chunked attention on 3 of 4 layers, every layer MoE with a shared expert
        family="llama4_text",
        vocab_size=V,
        hidden_size=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=128,
        num_experts=4,
        moe_top_k=1,
        moe_ffn_hidden_size=32,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=32,
        sliding_window=4,
        sliding_window_layers=(0, 1, 2),
        window_kind="chunked",
    ),
}

_HAS_PRESETS = importlib.util.find_spec("model_specs.presets") is not None
TINY_PRESETS = ("tiny", "tiny-moe", "tiny-mla")


def _preset(name: str) -> ModelSpec:
    from model_specs.presets import get_model  # type: ignore[import-not-found]

    return get_model(name)


def _tiny() -> ModelSpec:
    """The `tiny` preset when model_specs.presets exists, else an equivalent small Llama."""
    if _HAS_PRESETS:
        return _preset("tiny")
    return SPECS["dense-gqa"]


@pytest.mark.parametrize("name", list(SPECS))
def test_param_count_matches_count_params(name: str) -> None:
    spec = SPECS[name]
    model = build_model(spec, device="meta")
    assert num_params(model) == count_params(spec).total


@pytest.mark.skipif(not _HAS_PRESETS, reason="model_specs.presets not written yet")
@pytest.mark.parametrize("name", TINY_PRESETS)
def test_param_count_tiny_presets(name: str) -> None:
    spec = _preset(name)
    assert num_params(build_model(spec, device="meta")) == count_params(spec).total


def test_param_count_real_llama8b_shape_on_meta() -> None:
    spec = ModelSpec(
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        ffn_hidden_size=14336,
    )
    assert num_params(build_model(spec, device="meta")) == count_params(spec).total == 8_030_261_248


@pytest.mark.parametrize("name", list(SPECS))
def test_forward_shape_finite_and_causal(name: str) -> None:
    spec = SPECS[name]
    torch.manual_seed(0)
    model = build_model(spec).eval()
    tokens = torch.randint(0, V, (2, 12))
    logits = model(tokens)
    assert logits.shape == (2, 12, V)
    assert torch.isfinite(logits).all()
    # Changing the last token must not change any earlier position (causal mask, also through MoE).
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % V
    torch.testing.assert_close(model(changed)[:, :-1], logits[:, :-1], rtol=1e-5, atol=1e-5)


def test_tied_embeddings_share_storage() -> None:
    model = build_model(SPECS["gpt2-like"])
    assert model.output is not None and model.tok_embeddings is not None
    assert model.output.weight is model.tok_embeddings.weight


def test_bf16_build() -> None:
    model = build_model(SPECS["mla-moe"], dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32
    assert model(torch.randint(0, V, (1, 8))).dtype == torch.bfloat16


def test_mla_unsupported_combinations_raise() -> None:
    spec = SPECS["mla-no-qlora"].model_copy(update={"attention_sinks": True})
    with pytest.raises(NotSupportedError, match="attention_sinks"):
        build_model(spec, device="meta")


# ---- attention kernels --------------------------------------------------------------------------


def _naive_attention(q, k, v, *, window=None, chunked=False, alibi=None, sinks=None):
    """Textbook softmax(QK^T/sqrt(d) + bias) V over (B, H, S, d) with kv heads repeated."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q.shape[-2]
    i = torch.arange(s)
    dist = (i[:, None] - i[None, :]).float()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = dist >= 0
    if window is not None:
        allowed &= (i[:, None] // window == i[None, :] // window) if chunked else dist < window
    if alibi is not None:
        scores = scores - alibi[:, None, None] * dist
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(1, -1, 1, 1).expand(q.shape[0], -1, s, 1)], dim=-1)
        return scores.softmax(-1)[..., :-1] @ v
    return scores.softmax(-1) @ v


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"window": 3},
        {"alibi": True},
        {"sinks": True},
        {"window": 3, "sinks": True},
        {"alibi": True, "window": 5},
        {"window": 4, "chunked": True},
        {"window": 4, "chunked": True, "sinks": True},
    ],
)
def test_attention_core_matches_naive(kw: dict) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 9, 8)
    k = torch.randn(2, 2, 9, 8)
    v = torch.randn(2, 2, 9, 8)
    args = {
        "window": kw.get("window"),
        "chunked": kw.get("chunked", False),
        "alibi": alibi_slopes(4) if kw.get("alibi") else None,
        "sinks": torch.randn(4) if kw.get("sinks") else None,
    }
    torch.testing.assert_close(attention_core(q, k, v, **args), _naive_attention(q, k, v, **args))


def test_alibi_slopes_bloom() -> None:
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert alibi_slopes(6).shape == (6,)


# ---- MoE ----------------------------------------------------------------------------------------


def test_moe_dispatch_matches_per_token_loop() -> None:
    torch.manual_seed(0)
    spec = SPECS["moe-shared"].model_copy(update={"mlp_bias": True, "router_bias": True})
    moe = MoE(spec)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(3, 5, 64)
    out = moe(x)
    flat = x.reshape(-1, 64)
    idx, w = moe.route(flat)
    e = moe.experts
    ref = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for j in range(spec.moe_top_k):
            ex = int(idx[t, j])
            a = F.silu(flat[t] @ e.w1[ex].T + e.b1[ex]) * (flat[t] @ e.w3[ex].T + e.b3[ex])
            ref[t] += w[t, j] * (a @ e.w2[ex].T + e.b2[ex])
    shared = sum(ff(flat) for ff in moe.shared_experts)
    ref = ref + torch.sigmoid(moe.shared_gate(flat)) * shared
    torch.testing.assert_close(out, ref.view_as(x), rtol=1e-5, atol=1e-5)


def test_moe_sigmoid_routing_uses_correction_bias_for_selection_only() -> None:
    spec = SPECS["mla-moe"]
    moe = MoE(spec)
    x = torch.randn(10, 64)
    with torch.no_grad():
        moe.expert_bias.copy_(torch.tensor([100.0, 100.0, 100.0] + [0.0] * 5))
    idx, w = moe.route(x)
    assert set(idx.flatten().tolist()) == {0, 1, 2}  # the bias forces the choice ...
    scores = moe.router(x).sigmoid().gather(-1, idx)
    torch.testing.assert_close(w, scores / scores.sum(-1, keepdim=True))  # ... but not the weights
    torch.testing.assert_close(w.sum(-1), torch.ones(10))


def test_moe_balanced_counts_under_fake_mode() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    moe = MoE(SPECS["moe-shared"])
    with FakeTensorMode():
        idx = torch.randint(0, 8, (13 * 2,))
        counts = moe.tokens_per_expert(idx)
    assert counts == [4, 4, 3, 3, 3, 3, 3, 3] and sum(counts) == 26


# ---- pipeline-stage surgery -----------------------------------------------------------------------


def test_stage_split_reproduces_full_model() -> None:
    spec = SPECS["gpt2-like"].model_copy(update={"tie_embeddings": False})
    torch.manual_seed(0)
    full = build_model(spec).eval()
    first, last = build_model(spec).eval(), build_model(spec).eval()
    first.load_state_dict(full.state_dict())
    last.load_state_dict(full.state_dict())
    del first.layers["1"]
    first.norm = first.output = None
    del last.layers["0"]
    last.tok_embeddings = last.pos_embeddings = None
    tokens = torch.randint(0, V, (2, 10))
    hidden = first(tokens)
    assert hidden.shape == (2, 10, 64)
    torch.testing.assert_close(last(hidden), full(tokens))


# ---- real training steps ------------------------------------------------------------------------


def test_tiny_trains_on_cpu() -> None:
    spec = _tiny()
    torch.manual_seed(0)
    model = build_model(spec, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    seq = min(32, spec.max_position_embeddings)
    data = torch.randint(0, spec.vocab_size, (4, seq + 1), generator=gen)
    tokens, targets = data[:, :-1], data[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = model.loss(tokens, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - math.log(spec.vocab_size)) < 0.1 * math.log(spec.vocab_size)
    assert losses[-1] < losses[0] - 0.1
