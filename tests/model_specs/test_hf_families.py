"""Families added to the reviewed list, and configs refused rather than guessed.

Ground truth is transformers' own count: the vendored config is built with
`AutoModelForCausalLM.from_config` on the meta device (the text model of a multimodal wrapper, as
`get_text_config()` gives it) and its parameters are summed. The configs under model_specs/data are
copies of the checkpoints' `config.json` on the HuggingFace Hub: google/gemma-2-9b,
google/gemma-3-1b-pt, google/gemma-3-27b-pt, allenai/OLMo-2-1124-7B,
meta-llama/Llama-4-Scout-17B-16E, ibm-granite/granite-3.1-8b-base and
microsoft/Phi-3.5-mini-instruct (its `rope_scaling` long/short factor lists left out: RoPE scaling
changes no count, FLOP or byte).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import model_specs
from model_specs.hf import UNMODELLED_FIELDS, ModelConfigError, from_hf_config, load_hf_config
from model_specs.params import count_params

DATA = Path(model_specs.__file__).parent / "data"

# config file -> the count the model card / Hub states (elements); transformers must agree too.
PUBLISHED = {
    "gemma-2-9b": 9_241_705_984,
    "gemma-3-1b-pt": 999_885_952,
    "gemma-3-27b-pt": 27_009_346_304,  # text model; the SigLIP tower is named as not priced
    "olmo-2-1124-7b": 7_298_617_344,
    "llama-4-scout-17b-16e": 107_769_861_120,  # text model: 16 routed + 1 shared expert per layer
    "granite-3.1-8b-base": 8_170_848_256,
    "phi-3.5-mini-instruct": 3_821_079_552,
    # hybrid Mamba-2 (nemotron_h): the 56B's 56.3B; Nemotron 3 Nano's 31.6B (issue 14's transformers counts)
    "nemotron-h-56b": 56_324_350_464,
    "nemotron-3-nano-30b-a3b": 31_577_937_344,
}


def transformers_count(cfg: dict) -> int:
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if not k.startswith("_")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf.get_text_config())
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_count_equals_transformers(name: str) -> None:
    cfg = load_hf_config(DATA / f"{name}.json")
    ours = count_params(from_hf_config(cfg)).total
    assert ours == transformers_count(cfg) == PUBLISHED[name]


def test_gemma_rules():
    g2 = from_hf_config(load_hf_config(DATA / "gemma-2-9b.json"))
    assert g2.tie_embeddings and g2.norm_placement == "sandwich" and g2.norms_per_layer == 4 and g2.mlp == "geglu"
    assert [g2.uses_sliding_window(i) for i in range(4)] == [True, False, True, False]  # even layers local
    assert any("attn_logit_softcapping" in n for n in g2.notes)
    g3 = from_hf_config(load_hf_config(DATA / "gemma-3-27b-pt.json"))
    # Gemma3TextConfig defaults fill what the 27B text_config leaves out
    assert g3.vocab_size == 262_208 and g3.qk_norm and g3.qk_norm_scope == "head"
    assert [i for i in range(12) if not g3.uses_sliding_window(i)] == [5, 11]  # 5 local : 1 global
    assert any(n.startswith("vision_config (siglip_vision_model): not priced") for n in g3.notes)


def test_family_defaults_match_the_transformers_configuration_class():
    from model_specs.hf import FAMILIES

    defaults = transformers.Gemma3TextConfig().to_dict()
    for key, value in FAMILIES["gemma3_text"].defaults.items():
        assert defaults[key] == value, key
    assert FAMILIES["gemma2"].tie is transformers.Gemma2Config().tie_word_embeddings is True


def test_olmo2_projection_wide_qk_norm_and_post_norms():
    spec = from_hf_config(load_hf_config(DATA / "olmo-2-1124-7b.json"))
    assert spec.qk_norm_scope == "projection" and spec.norm_placement == "post"
    per_head = count_params(spec.model_copy(update={"qk_norm_scope": "head"})).total
    # q/k scales over 32 x 128 wide projections, not 2 x 128 per head: the 262,144 an unread norm missed
    assert count_params(spec).total - per_head == 32 * (2 * 4096 - 2 * 128)


def test_llama4_shared_expert_and_chunked_attention():
    spec = from_hf_config(load_hf_config(DATA / "llama-4-scout-17b-16e.json"))
    assert spec.num_experts == 16 and spec.moe_top_k == 1 and spec.num_shared_experts == 1
    assert spec.moe_layer_count == 48 and spec.window_kind == "chunked" and spec.sliding_window == 8192
    assert [spec.uses_sliding_window(i) for i in range(4)] == [True, True, True, False]  # every 4th is global NoPE
    maverick_like = load_hf_config(DATA / "llama-4-scout-17b-16e.json")
    maverick_like["text_config"] |= {"interleave_moe_layer_step": 2, "num_local_experts": 128}
    m = from_hf_config(maverick_like)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True] and m.ffn_hidden_size == 16384


def test_chunked_attention_flops():
    from cost_models.flops import attention_pairs

    spec = from_hf_config(load_hf_config(DATA / "llama-4-scout-17b-16e.json"))
    c = 8192
    assert attention_pairs(spec, 0, c, "causal") == attention_pairs(spec, 3, c, "causal")  # one chunk = causal
    assert attention_pairs(spec, 0, 4 * c + 10, "causal") == 4 * c * (c + 1) / 2 + 10 * 11 / 2
    assert attention_pairs(spec, 3, 4 * c, "causal") == 4 * c * (4 * c + 1) / 2  # the global layer


def test_gpt_oss_active_convention():
    c = count_params(from_hf_config(load_hf_config(DATA / "gpt-oss-120b.json")))
    # model card: 5.13B active, without the input token table (a lookup); `active` keeps it
    assert abs(c.active_compute - 5.13e9) < 0.005e9 and c.active - c.active_compute == c.embedding


def test_granite_multipliers_are_noted():
    spec = from_hf_config(load_hf_config(DATA / "granite-3.1-8b-base.json"))
    assert {n.split(":")[0] for n in spec.notes} == {
        "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
    }


# ---- refused, never guessed -----------------------------------------------------------------------
NEMOTRON_H_56B = {k: v for k, v in load_hf_config(DATA / "nemotron-h-56b.json").items() if not k.startswith("_")}


def test_nemotron_h_56b_hybrid_layers():
    """118 layers: 54 Mamba-2, 54 MLP, 10 attention (Nemotron-H paper), one norm per layer; the
    Mamba mixer's parameters piece by piece (transformers NemotronHMamba2Mixer)."""
    from model_specs.params import layer_params, mamba_params

    spec = from_hf_config(NEMOTRON_H_56B)
    pattern = spec.hybrid_pattern
    assert pattern is not None and spec.num_layers == len(pattern) == 118
    assert (pattern.count("M"), pattern.count("-"), pattern.count("*")) == (54, 54, 10)
    assert spec.norms_per_layer == 1 and not spec.is_moe and spec.mlp == "relu2"
    inner, conv = 256 * 64, 256 * 64 + 2 * 8 * 256
    in_proj = 8192 * (inner + conv + 256)  # z, x B C, dt
    assert mamba_params(spec) == in_proj + conv * 4 + conv + 3 * 256 + inner + inner * 8192
    assert layer_params(spec, 0).total == mamba_params(spec) + 8192
    assert layer_params(spec, 1).total == 2 * 8192 * 32768 + 8192  # relu2 MLP, no gate
    assert layer_params(spec, pattern.index("*")).total == 8192 * 8192 * 2 + 2 * 8192 * 1024 + 8192


def test_nemotron_h_reads_the_older_state_size_name():
    """`mamba_d_state` (older Nemotron-H configs) is read as `ssm_state_size`, not refused."""
    renamed = {k: v for k, v in NEMOTRON_H_56B.items() if k != "ssm_state_size"} | {"mamba_d_state": 64}
    assert from_hf_config(renamed).mamba_state_size == 64
    assert from_hf_config(NEMOTRON_H_56B | {"ssm_state_size": 64}).mamba_state_size == 64


def test_nemotron_3_nano_moe_hybrid():
    spec = from_hf_config(load_hf_config(DATA / "nemotron-3-nano-30b-a3b.json"))
    assert spec.moe_layer_count == 23 and spec.num_experts == 128 and spec.moe_top_k == 6
    assert spec.num_shared_experts == 1 and spec.shared_expert_ffn_hidden_size == 3712
    assert [spec.layer_mixer(i) for i in range(6)] == ["mamba", "moe", "mamba", "moe", "mamba", "attention"]


@pytest.mark.parametrize(
    ("cfg", "pattern"),
    [
        (NEMOTRON_H_56B | {"model_type": "nemotron"}, r"hybrid_override_pattern \(a hybrid Mamba-2"),
        (NEMOTRON_H_56B | {"moe_latent_size": 512}, r"moe_latent_size \(latent MoE"),
        (NEMOTRON_H_56B | {"hybrid_override_pattern": "M-X" * 39 + "M"}, r"symbols \['X'\] autopar does not price"),
        ({**NEMOTRON_H_56B, "hybrid_override_pattern": None, "layers_block_type": ["mamba", "gated_delta"]},
         r"layers_block_type names block kinds \['gated_delta'\]"),
        ({**load_hf_config(DATA / "qwen3-0.6b.json"), "full_attention_interval": 4},
         r"qwen3 config: field\(s\) full_attention_interval \(linear-attention"),
        ({**load_hf_config(DATA / "llama3-8b.json"), "cross_attention_layers": [3, 8]}, r"cross-attention layers"),
        ({**load_hf_config(DATA / "qwen3-0.6b.json"), "layer_types": ["mamba"] * 28},
         r"layer_types names layer kinds \['mamba'\] that autopar does not price"),
        ({"model_type": "gemma3", "text_config": {**load_hf_config(DATA / "llama3-8b.json"), "model_type": "mystery"}},
         r"model_type 'mystery' is not a supported family"),
    ],
)
def test_refusals_name_the_type_and_the_field(cfg: dict, pattern: str) -> None:
    with pytest.raises(ModelConfigError, match=pattern):
        from_hf_config(cfg)


def test_every_unmodelled_field_is_refused():
    base = load_hf_config(DATA / "llama3-8b.json")
    for key in UNMODELLED_FIELDS:
        with pytest.raises(ModelConfigError, match=key):
            from_hf_config(base | {key: 4})
