"""Ground truth for cost_models.flops: PyTorch's FlopCounterMode on the reference model.

The reference `Transformer` runs forward + backward under FakeTensorMode (bf16, batch 1) and
`FlopCounterMode`. With the MATH SDPA backend the counter sees attention as two bmm forward and
their gradients, which is the full-attention "model FLOPs" convention (3 x forward) of
`step_flops(...).model_flops`; with the CPU flash kernel (formulas registered by
`runtime.flop_count`) it sees forward 4*S^2*d + backward 10*S^2*d, our full-attention "hardware"
count with `flash_backward_factor`. MoE routing under fake tensors is a balanced assignment of
exactly top_k experts per token (runtime/model.py, `MoE`); a real-tensor test checks that
unbalanced routing counts the same.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cost_models.flops import flash_backward_factor, step_flops  # noqa: E402
from model_specs.spec import ModelSpec  # noqa: E402
from runtime.flop_count import measure_step_flops, register_cpu_flash_flop_formulas  # noqa: E402
from runtime.model import build_model  # noqa: E402

TOL = 0.01

LLAMA3_8B_2L = ModelSpec(
    name="llama3-8b-2-layers",
    vocab_size=128256,
    hidden_size=4096,
    num_layers=2,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
)
GPT_MHA = ModelSpec(
    name="gpt2-xl-shaped-2-layers",
    family="gpt2",
    vocab_size=50257,
    hidden_size=1600,
    num_layers=2,
    num_heads=25,
    ffn_hidden_size=6400,
    mlp="gelu",
    norm="layernorm",
    qkv_bias=True,
    attn_out_bias=True,
    mlp_bias=True,
    tie_embeddings=True,
    position_embedding="learned",
    max_position_embeddings=2048,
)
MIXTRAL_2L = ModelSpec(
    name="mixtral-8x7b-2-layers",
    family="mixtral",
    vocab_size=32000,
    hidden_size=4096,
    num_layers=2,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    num_experts=8,
    moe_top_k=2,
    moe_ffn_hidden_size=14336,
)
DEEPSEEK_V3_2L = ModelSpec(
    name="deepseek-v3-2-layers",  # layer 0 dense (first_k_dense), layer 1 MoE, all 256 experts
    family="deepseek_v3",
    vocab_size=129280,
    hidden_size=7168,
    num_layers=2,
    num_heads=128,
    ffn_hidden_size=18432,
    attention="mla",
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    num_experts=256,
    moe_top_k=8,
    moe_ffn_hidden_size=2048,
    num_shared_experts=1,
    first_k_dense_layers=1,
    router_score_correction_bias=True,
)
GPT_OSS_SMALL = ModelSpec(
    name="gpt-oss-shaped-small",  # sinks (eager softmax path), sliding window every 2nd layer, MoE
    family="gpt_oss",
    vocab_size=2048,
    hidden_size=256,
    num_layers=2,
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    ffn_hidden_size=256,
    qkv_bias=True,
    attn_out_bias=True,
    mlp_bias=True,
    attention_sinks=True,
    sliding_window=128,
    sliding_window_every=2,
    num_experts=8,
    moe_top_k=4,
    moe_ffn_hidden_size=256,
    router_bias=True,
)

CASES = [
    pytest.param(LLAMA3_8B_2L, 8192, id="llama3-8b-2L-s8192"),
    pytest.param(GPT_MHA, 2048, id="gpt-mha-2L-s2048"),
    pytest.param(MIXTRAL_2L, 4096, id="mixtral-2L-s4096"),
    pytest.param(DEEPSEEK_V3_2L, 4096, id="deepseek-v3-mla-2L-s4096"),
    pytest.param(GPT_OSS_SMALL, 512, id="gpt-oss-small-s512"),
]


def _rel(a: float, b: float) -> float:
    return abs(a - b) / b


@pytest.mark.parametrize(("spec", "seq"), CASES)
def test_math_backend_counts_model_flops(spec: ModelSpec, seq: int) -> None:
    """MATH SDPA backend: counter == step_flops(...).model_flops (full attention, 3 x forward)."""
    measured = measure_step_flops(spec, seq, backend="math")
    ours = step_flops(spec, seq, 1)
    assert _rel(measured.total, ours.model_flops) < TOL, (measured.by_op, ours)


@pytest.mark.parametrize(("spec", "seq"), [CASES[0], CASES[1], CASES[2]])
def test_cpu_flash_backend_counts_flash_hardware_flops(spec: ModelSpec, seq: int) -> None:
    """CPU flash kernel with registered formulas: GEMMs 6NT + attention (1 + 2.5) x forward, full
    attention (the counter does not halve for the causal mask)."""
    measured = measure_step_flops(spec, seq, backend="flash")
    ours = step_flops(spec, seq, 1)
    attn_fwd = ours.attention_flops / 3
    assert measured.attention > 0, "flash formulas not registered: attention counted as 0"
    factor = flash_backward_factor(spec)
    assert _rel(measured.attention, (1 + factor) * attn_fwd) < 1e-9
    assert _rel(measured.total, ours.matmul_flops + (1 + factor) * attn_fwd) < TOL


def test_flash_formula_registration_is_idempotent() -> None:
    register_cpu_flash_flop_formulas()
    register_cpu_flash_flop_formulas()


def test_flash_backward_factor_for_mla_head_dims() -> None:
    """PyTorch's flash backward formula is 2 s^2 (3 d_qk + 2 d_v) vs forward 2 s^2 (d_qk + d_v): the
    ratio is 2.5 only when d_qk == d_v; for DeepSeek-V3 MLA (d_qk 192, d_v 128) it is 2.6, which
    `cost_models.flops.flash_backward_factor` must reproduce.
    (On CPU, SDPA with d_qk != d_v falls back to the math kernel, so this is checked on formulas.)"""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    b, h, s = 1, 128, 4096
    q, k, v = (b, h, s, 192), (b, h, s, 192), (b, h, s, 128)
    fwd = sdpa_flop_count(q, k, v)
    bwd = sdpa_backward_flop_count((b, h, s, 128), q, k, v)
    mla = ModelSpec(
        vocab_size=1000, hidden_size=7168, num_layers=1, num_heads=128, ffn_hidden_size=18432, attention="mla",
        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    )
    assert bwd / fwd == pytest.approx(flash_backward_factor(mla)) == pytest.approx(2.6)
    q = k = v = (b, h, s, 128)
    dense = LLAMA3_8B_2L
    assert sdpa_backward_flop_count(q, q, k, v) / sdpa_flop_count(q, k, v) == flash_backward_factor(dense) == 2.5


def test_moe_flops_real_tensors_unbalanced_routing() -> None:
    """With real tensors routing is whatever the router says (unbalanced); routed GEMMs are still
    exactly top_k x tokens x expert FFN, so the count equals step_flops."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    spec = ModelSpec(
        vocab_size=256,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=64,
        num_experts=8,
        moe_top_k=2,
        moe_ffn_hidden_size=48,
        num_shared_experts=1,
        shared_expert_gate=True,
        first_k_dense_layers=1,
    )
    torch.manual_seed(0)
    model = build_model(spec)
    with torch.no_grad():  # skew the router so the routing is far from balanced
        model.layers["1"].mlp.router.weight.mul_(50.0)
    seen: list[list[int]] = []
    model.layers["1"].mlp.experts.register_forward_pre_hook(lambda _m, args: seen.append(args[1]))
    tokens = torch.randint(0, 256, (2, 64))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.loss(tokens, tokens).backward()
    (counts,) = seen
    assert sum(counts) == 2 * 64 * 2 and max(counts) > 2 * min(counts)  # really unbalanced
    assert counter.get_total_flops() == step_flops(spec, 64, 2).model_flops


# ---- hybrid Mamba-2 layers ------------------------------------------------------------------------

NEMOTRON_H_SHAPED = ModelSpec(
    name="nemotron-h-shaped-small",  # Nemotron-H-56B's Mamba / attention / MLP mixers at 1/8 width
    family="nemotron_h",
    vocab_size=4096,
    hidden_size=1024,
    num_layers=4,
    num_heads=8,
    num_kv_heads=1,
    head_dim=128,
    ffn_hidden_size=4096,
    mlp="relu2",
    hybrid_pattern="M-*E",
    mamba_num_heads=32,
    mamba_head_dim=64,
    mamba_state_size=256,
    mamba_groups=8,
    mamba_chunk_size=128,
    num_experts=8,
    moe_top_k=2,
    moe_ffn_hidden_size=512,
    num_shared_experts=1,
    shared_expert_ffn_hidden_size=1024,
)


@pytest.mark.parametrize("seq", [2048, 1000])  # 1000: the scan pads the last chunk (8 chunks of 128)
def test_hybrid_mamba_layer_flops(seq: int) -> None:
    """A Mamba-2 layer (in_proj, out_proj and the chunked SSD scan's matmuls) beside attention, MLP
    and MoE layers: FlopCounterMode on the runtime's reference model against `step_flops`. The
    runtime checkpoints the mixer core (as mamba_ssm's fused kernel keeps only its input), so the
    counter sees the scan's forward once more: model FLOPs + scan / 3."""

    measured = measure_step_flops(NEMOTRON_H_SHAPED, seq, backend="math")
    ours = step_flops(NEMOTRON_H_SHAPED, seq, 1)
    assert ours.scan_flops > 0  # the Mamba layers' scans are counted (checked against the trace below)
    assert _rel(measured.total, ours.model_flops + ours.scan_flops / 3) < TOL, (measured.by_op, ours)
    # the scan's matmuls are batched (bmm); the attention core of the math backend too: the bmm
    # total is the attention scores (3 x forward) and the scan (4 x forward)
    assert _rel(measured.by_op["bmm"], ours.attention_flops + 4 / 3 * ours.scan_flops) < TOL


def test_hybrid_mamba_only_layer_flops_and_hardware_count() -> None:
    """One Mamba-2 layer alone (pattern "M"): every counted FLOP is the layer's and the LM head's,
    and the hardware count (scan 4 x forward, no attention) is what the counter sees."""
    spec = NEMOTRON_H_SHAPED.model_copy(
        update={"num_layers": 1, "hybrid_pattern": "M", "num_experts": 0, "moe_top_k": 0, "moe_ffn_hidden_size": None,
                "num_shared_experts": 0, "shared_expert_ffn_hidden_size": None}
    )
    spec = ModelSpec.model_validate(spec.model_dump())
    measured = measure_step_flops(spec, 4096, backend="math")
    ours = step_flops(spec, 4096, 1)
    assert _rel(measured.total, ours.hardware_flops) < TOL
    layer = measured.total - 6 * 4096 * spec.vocab_size * spec.hidden_size
    assert layer > 0.5 * measured.total  # the comparison is about the Mamba layer, not the LM head


def test_hybrid_reference_model_parameters_equal_count_params() -> None:
    from model_specs.params import count_params
    from runtime.model import num_params

    with torch.device("meta"):
        model = build_model(NEMOTRON_H_SHAPED, device="meta")
    assert num_params(model) == count_params(NEMOTRON_H_SHAPED).total


def test_ssd_chunked_scan_matches_the_recurrence() -> None:
    """The chunked SSD scan equals Mamba-2's recurrence h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t,
    y_t = C_t h_t (Dao & Gu 2024, Eq. 1), for a length that is not a multiple of the chunk."""
    from runtime.model import ssd_chunked_scan

    g = torch.Generator().manual_seed(0)
    b, s, heads, p, groups, n = 2, 37, 4, 3, 2, 5
    x = torch.randn(b, s, heads, p, generator=g)
    dt = torch.rand(b, s, heads, generator=g)
    a = -torch.rand(heads, generator=g)
    bm, cm = torch.randn(b, s, groups, n, generator=g), torch.randn(b, s, groups, n, generator=g)
    y = ssd_chunked_scan(x, dt, a, bm, cm, 8)
    bh, ch = bm.repeat_interleave(2, dim=2), cm.repeat_interleave(2, dim=2)
    h = torch.zeros(b, heads, n, p)
    ref = []
    for t in range(s):
        h = h * torch.exp(dt[:, t] * a)[..., None, None] + bh[:, t, :, :, None] * (x[:, t] * dt[:, t, :, None])[:, :, None]
        ref.append(torch.einsum("bhn,bhnp->bhp", ch[:, t], h))
    assert torch.allclose(y, torch.stack(ref, 1), atol=1e-5)
