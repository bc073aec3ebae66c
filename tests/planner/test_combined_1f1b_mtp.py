"""Megatron-Core refuses combined 1F1B (--overlap-moe-expert-parallel-comm) beside an MTP module without
pipeline parallelism (TransformerConfig.__post_init__, megatron-core 0.16.1): the layout rule and the
search's options agree, so the DeepSeek-V3 plan `autopar plan` recommends is one Megatron-LM accepts."""

from __future__ import annotations

from cost_models.layout import Layout, validate_layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.space import Mesh, PipeOption, combined_1f1b_options

TR = TrainingSpec(seq_len=4096, global_batch=2048)


def test_layout_refuses_combined_1f1b_with_mtp_on_one_stage() -> None:
    model = get_model("deepseek-v3")
    flat = Layout(tp=4, ep=64, moe_a2a_overlap=True)
    assert any("needs pipeline parallelism" in v.message for v in validate_layout(model, TR, 2048, flat))
    lora = TR.model_copy(update={"method": "lora"})  # a frozen base trains no MTP module: nothing to refuse
    assert not any(v.path == ("moe_a2a_overlap",) for v in validate_layout(model, lora, 2048, flat))


def test_search_offers_combined_1f1b_with_mtp_only_on_a_pipeline() -> None:
    model = get_model("deepseek-v3")
    flat = Mesh(4, 1, 1, 512, 64, 4, "tp-cp-ep-dp-pp")
    options = [PipeOption(1, "1f1b")]
    assert combined_1f1b_options(model, flat, 8, "megatron", options, mtp_layers=1) == []
    assert combined_1f1b_options(model, flat, 8, "megatron", options, mtp_layers=0)[0].a2a_overlap
    piped = Mesh(4, 4, 1, 128, 64, 4, "tp-cp-ep-dp-pp")
    assert combined_1f1b_options(model, piped, 8, "megatron", [PipeOption(2, "interleaved_1f1b")], mtp_layers=1)
