"""Layout validation names every violated constraint and its field."""

import pytest

from cost_models.layout import Layout, LayoutError, validate_layout
from model_specs.spec import ModelSpec, TrainingSpec

DENSE = ModelSpec(
    name="d", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336
)
MOE = ModelSpec(
    name="m", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
    ffn_hidden_size=14336, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=14336,
)
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)


def fields(model: ModelSpec, gpus: int, **kw: object) -> set[str]:
    return {v.field for v in validate_layout(model, TRAIN, gpus, Layout(**kw))}


def test_valid_layouts() -> None:
    assert fields(DENSE, 64, tp=8, pp=2) == set()
    assert fields(DENSE, 64, tp=4, pp=4, vpp=2, micro_batch=1) == set()
    assert fields(MOE, 64, tp=1, ep=8, pp=2) == set()


def test_degrees_must_divide_gpus() -> None:
    errs = validate_layout(DENSE, TRAIN, 64, Layout(tp=3))
    assert errs and errs[0].field == "dp"
    assert "does not divide the 64 GPUs" in errs[0].message
    assert fields(DENSE, 64, tp=8, dp=4) == {"dp"}  # 8 x 4 != 64


def test_tp_must_divide_heads() -> None:
    model = DENSE.model_copy(update={"num_heads": 24, "num_kv_heads": 8, "ffn_hidden_size": 14336})
    assert "tp" in fields(model, 32, tp=16)


def test_ep_constraints() -> None:
    assert "ep" in fields(MOE, 64, ep=3)  # does not divide 8 experts
    assert "ep" in fields(DENSE, 64, ep=2)  # dense model
    # ep x etp must divide dp x cp x tp: dp=1, tp=8, ep=8, etp=8 -> 64 does not divide 8
    errs = validate_layout(MOE, TRAIN, 16, Layout(tp=8, pp=2, ep=8))
    assert any(v.field == "ep" and "carved out" in v.message for v in errs)


def test_unfolded_expert_grid_constraints() -> None:
    """Without MoE parallel folding (Megatron-Core 0.9) EP is carved out of dp alone, expert TP is TP
    and ep sits next to dp in the rank order; folding accepts each of these layouts."""
    unfolded = {"moe_parallel_folding": False}
    assert fields(MOE, 64, tp=4, cp=2, ep=8, **unfolded) == set()  # dp 8
    assert fields(MOE, 64, tp=4, cp=4, ep=8) == set()  # folded: ep over dp x cp = 16 ranks
    errs = validate_layout(MOE, TRAIN, 64, Layout(tp=4, cp=4, ep=8, **unfolded))  # dp 4
    assert [v.field for v in errs] == ["ep"] and "must divide dp=4" in errs[0].message
    assert fields(MOE, 64, tp=4, ep=8, etp=1) == set()
    assert fields(MOE, 64, tp=4, ep=8, etp=1, **unfolded) == {"etp"}
    assert fields(MOE, 64, tp=2, pp=2, ep=4, order="tp-cp-ep-pp-dp") == set()
    assert fields(MOE, 64, tp=2, pp=2, ep=4, order="tp-cp-ep-pp-dp", **unfolded) == {"order"}
    assert fields(MOE, 64, tp=2, pp=2, ep=4, order="tp-pp-cp-ep-dp", **unfolded) == set()


def test_vpp_constraints() -> None:
    assert "vpp" in fields(DENSE, 64, tp=8, vpp=2)  # needs pp > 1
    assert "vpp" in fields(DENSE, 64, tp=8, pp=2, vpp=3)  # 6 chunks do not divide 32 layers
    assert "schedule" in fields(DENSE, 64, tp=8, pp=2, vpp=2, schedule="1f1b")


def test_batch_divisibility_is_named() -> None:
    errs = validate_layout(DENSE, TrainingSpec(seq_len=4096, global_batch=100), 64, Layout(tp=8))
    assert [v.field for v in errs] == ["micro_batch"]
    assert "not divisible by micro_batch x dp" in errs[0].message


def test_every_violation_reported() -> None:
    errs = validate_layout(DENSE, TRAIN, 64, Layout(tp=8, vpp=2, ep=2, zero_stage=0, offload_optimizer=True))
    assert {"vpp", "ep", "offload_optimizer"} <= {v.field for v in errs}


def test_resolved_defaults() -> None:
    lay = Layout(tp=8, pp=2, vpp=2).resolved(64, TRAIN)
    assert (lay.dp, lay.grad_accum, lay.dp_shard, lay.sp, lay.schedule) == (4, 64, 4, True, "interleaved_1f1b")
    with pytest.raises(LayoutError):
        Layout(tp=8, micro_batch=3).resolved(64, TRAIN)


def test_attention_kernel_defaults_by_framework_and_reaches_the_geometry() -> None:
    """Megatron-Core runs Transformer Engine's fused attention, the PyTorch stacks SDPA's FlashAttention-2
    backend, unless the layout names a kernel; the shard geometry it is priced with carries it."""
    from cost_models.compute import ShardGeometry

    assert Layout().attention_kernel_ == "fused"
    assert Layout(framework="fsdp").attention_kernel_ == "flash2"
    assert Layout(framework="deepspeed").attention_kernel_ == "flash2"
    assert Layout(framework="fsdp", attention_kernel="fused").attention_kernel_ == "fused"
    assert ShardGeometry.of(Layout(framework="fsdp").resolved(64, TRAIN), 1, 4096).flash2
    assert not ShardGeometry.of(Layout(tp=8).resolved(64, TRAIN), 1, 4096).flash2
    with pytest.raises(ValueError):
        Layout(attention_kernel="flash4")


def test_framework_rules_name_what_the_framework_cannot_run() -> None:
    from cost_models.layout import framework_violations

    ds = Layout(tp=2, pp=4, vpp=2, cp=2, zero_stage=3, framework="deepspeed")
    fields = {v.field for v in framework_violations(ds)}
    assert {"cp", "vpp", "zero_stage"} <= fields
    titan = Layout(pp=2, account_for_loss_in_pipeline_split=True, framework="fsdp", recompute="op_sac")
    assert [v.field for v in framework_violations(titan)] == ["account_for_embedding_in_pipeline_split"]
    assert [v.field for v in framework_violations(Layout(recompute="op_sac"))] == ["recompute"]


def test_interleaving_takes_the_micro_batch_counts_each_framework_runs() -> None:
    # 64 GPUs, tp 4, pp 4 -> dp 4; global batch 40 -> 10 micro-batches per pipeline
    train = TrainingSpec(seq_len=4096, global_batch=40)

    def errs(**kw: object) -> list:
        return validate_layout(DENSE, train, 64, Layout(tp=4, pp=4, vpp=2, **kw))

    assert errs() == []  # Megatron-Core: groups of 5 (10 % 4 = 2 < 4 would stall)
    assert errs(framework="fsdp") == []  # torch: 2 rounds of 5
    short = validate_layout(DENSE, TrainingSpec(seq_len=4096, global_batch=12), 64, Layout(tp=4, pp=4, vpp=2))
    assert [e.field for e in short] == ["grad_accum"] and "no N fits m=3" in short[0].message
    odd = validate_layout(
        DENSE, TrainingSpec(seq_len=4096, global_batch=36), 64, Layout(tp=4, pp=4, vpp=2, framework="fsdp")
    )  # 9 micro-batches: 2 rounds do not divide them; Megatron runs 9 in one group
    assert [e.field for e in odd] == ["grad_accum"] and "multiple of the rounds" in odd[0].message
    assert validate_layout(DENSE, TrainingSpec(seq_len=4096, global_batch=36), 64, Layout(tp=4, pp=4, vpp=2)) == []
