"""Starting from HuggingFace checkpoints (runtime/checkpoint.py): tiny random Llama, Qwen2, Mixtral
and Phi-3 models written by transformers' `save_pretrained` give transformers' own logits, in one
process and sharded (TP2, PP2, FSDP2, EP2 on 2 gloo ranks); a mismatching checkpoint is refused by
name; a run resumed from its distributed checkpoint continues the loss curve exactly.

Tolerances (fp32 throughout): one process computes what transformers computes op for op (measured:
bit-identical logits); so do PP2, FSDP2 and EP2 (measured: bit-identical); TP2 splits the matmuls and
all-reduces the partial sums, which reorders them (measured: <= 2.1e-7 on logits of magnitude ~0.7):
2e-6 absolute."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")  # the exports-check extra (scripts/test.sh installs it)

from model_specs.hf import load_hf_spec  # noqa: E402
from runtime.checkpoint import CheckpointError, HFCheckpoint  # noqa: E402
from runtime.spec import load_run_spec  # noqa: E402
from runtime.train import Trainer, train  # noqa: E402

NPROC = 2
SEQ = 32
LOGITS_ATOL = 2e-6
COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def _config(family: str):  # type: ignore[no-untyped-def]
    t = transformers
    if family == "llama":  # Llama 3.1's RoPE scaling, visible at 32 positions with a 16-token original
        return t.LlamaConfig(**COMMON, rope_scaling=LLAMA3_ROPE, rms_norm_eps=1e-5)
    if family == "qwen2":
        return t.Qwen2Config(**COMMON)
    if family == "mixtral":
        return t.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)
    return t.Phi3Config(**COMMON, pad_token_id=0, bos_token_id=1, eos_token_id=2)


_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM",
            "phi3": "Phi3ForCausalLM"}


@cache
def _hf_model(family: str):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return getattr(transformers, _CLASSES[family])(_config(family)).eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """save_pretrained of each family, sharded (an index and several files) so reads cross files."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for family in _CLASSES:
        out[family] = root / family
        _hf_model(family).save_pretrained(out[family], max_shard_size="100KB")
    return out


def _run(ckpt: Path, layout: dict[str, Any] | None = None, gpus: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "model": load_hf_spec(ckpt / "config.json").model_dump(mode="json"),
        "training": {"seq_len": SEQ, "global_batch": 4, "precision": "fp32", **extra.pop("training", {})},
        "gpus": gpus, "layout": layout or {}, "hf_checkpoint": str(ckpt), "seed": 3, **extra,
    }


def _tokens(seed: int = 1, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, COMMON["vocab_size"], (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def _reference_logits(family: str) -> torch.Tensor:
    with torch.no_grad():
        return _hf_model(family)(_tokens()).logits


# ---- one process -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(_CLASSES))
def test_one_process_gives_transformers_logits(checkpoints: dict[str, Path], family: str) -> None:
    trainer = Trainer(load_run_spec(_run(checkpoints[family])), torch.device("cpu"))
    with torch.no_grad():
        ours = trainer.parts.chunks[0](_tokens())
    torch.testing.assert_close(ours, _reference_logits(family), rtol=0, atol=1e-6)
    largest = max(p.numel() for p in trainer.parts.chunks[0].parameters())
    assert trainer.parts.staged_bytes == 4 * largest  # one read at a time: the largest fp32 tensor


def test_transformers_5_fused_experts_load_too(tmp_path: Path) -> None:
    """transformers 5 holds Mixtral's experts fused (mlp.experts.gate_up_proj: gate | up rows); a
    checkpoint in those names loads into the same weights."""
    from safetensors.torch import save_file

    model = _hf_model("mixtral")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(model.config.to_json_string())
    assert any("gate_up_proj" in k for k in model.state_dict())
    trainer = Trainer(load_run_spec(_run(tmp_path)), torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(trainer.parts.chunks[0](_tokens()), _reference_logits("mixtral"), rtol=0, atol=1e-6)


def test_lora_on_a_loaded_base_starts_at_the_base(checkpoints: dict[str, Path]) -> None:
    run = load_run_spec(_run(checkpoints["qwen2"], training={"method": "lora", "lora_rank": 4}))
    trainer = Trainer(run, torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(trainer.parts.chunks[0](_tokens()), _reference_logits("qwen2"), rtol=0, atol=1e-6)
    trained = [n for n, p in trainer.parts.chunks[0].named_parameters() if p.requires_grad]
    assert trained and all(n.endswith((".lora_A", ".lora_B")) for n in trained)


def test_qlora_quantizes_the_loaded_base_on_the_device(tmp_path: Path) -> None:
    """A QLoRA run from a checkpoint holds each layer linear as NF4 of the checkpoint's weight and
    computes what transformers computes with those weights round-tripped through NF4."""
    pytest.importorskip("torchao")
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**COMMON, "hidden_size": 256, "intermediate_size": 512})
    hf = transformers.LlamaForCausalLM(config).eval()  # every linear a multiple of 64 x 256 elements
    hf.save_pretrained(tmp_path)
    run = load_run_spec(_run(tmp_path, {"framework": "fsdp"}, training={"method": "qlora", "precision": "bf16"}))
    ours = Trainer(run, torch.device("cpu")).parts.chunks[0]
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".layers." in name and name.endswith("proj.weight"):
                p.copy_(to_nf4(p.detach()).get_original_weight())
        torch.testing.assert_close(ours(_tokens()), hf(_tokens()).logits, rtol=0, atol=1e-5)
    assert type(ours.layers["1"].mlp.w2.weight).__name__ == "NF4Tensor"


def test_save_pretrained_llama_3_8b_config_is_the_preset() -> None:
    """What transformers 5 writes for Llama-3-8B (explicit head_dim, rope_parameters) describes the
    `llama3-8b` preset a plan names, so a plan of the preset runs from such a checkpoint; its RoPE
    base and llama3 scaling come from the config."""
    from model_specs.presets import get_model
    from runtime.checkpoint import _rope_numerics, architecture_differences

    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}, rope_theta=500000.0,
    ).to_dict()
    assert architecture_differences(config, get_model("llama3-8b")) == []
    numerics = _rope_numerics(config)
    assert numerics["rope_theta"] == 500000.0 and numerics["rope_scaling"]["rope_type"] == "llama3"
    assert architecture_differences(config, get_model("llama3-70b"))[:1] == ["hidden_size (checkpoint 4096, run 8192)"]


def _copy(src: Path, dst: Path, drop: str | None = None, rename: tuple[str, str] | None = None) -> Path:
    """A one-file copy of checkpoint `src` without tensor `drop`, or with one tensor renamed."""
    from safetensors.torch import save_file

    model = _hf_model(json.loads((src / "config.json").read_text())["model_type"])
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != drop}
    if rename:
        tensors[rename[1]] = tensors.pop(rename[0])
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_mismatches_are_refused_by_name(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    llama = checkpoints["llama"]
    spec = load_hf_spec(llama / "config.json")
    with pytest.raises(CheckpointError, match=r"hidden_size \(checkpoint 64, run 128\)"):
        HFCheckpoint.open(llama, spec.model_copy(update={"hidden_size": 128}))
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.w2\.weight: the checkpoint has no model\.layers\.1\.mlp\.down_proj\.weight"):
        HFCheckpoint.open(_copy(llama, tmp_path / "a", drop="model.layers.1.mlp.down_proj.weight"), spec)
    with pytest.raises(CheckpointError, match=r"tensors the model has no parameter for: model\.layers\.0\.mlp\.gate_projection\.weight"):
        HFCheckpoint.open(_copy(llama, tmp_path / "b", rename=("model.layers.0.mlp.gate_proj.weight",
                                                               "model.layers.0.mlp.gate_projection.weight")), spec)
    config = json.loads((llama / "config.json").read_text())
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({**config, "model_type": "gemma"}))
    with pytest.raises(CheckpointError, match="model_type 'gemma'"):
        HFCheckpoint.open(tmp_path / "c", spec)


# ---- sharded, 2 gloo ranks ------------------------------------------------------------------------

LAYOUTS = {
    "llama": [{"tp": 2}, {"pp": 2}, {"zero_stage": 3}],
    "qwen2": [{"tp": 2}, {"pp": 2}, {"zero_stage": 3}],
    # MoE layers have no tensor-parallel plan in the runtime (parallelize.check_supported): EP instead
    "mixtral": [{"ep": 2}, {"pp": 2}, {"zero_stage": 3}],
    "phi3": [{"tp": 2}],
}


def _name(layout: dict[str, Any]) -> str:
    return "_".join(f"{k}{v}" for k, v in layout.items())


@pytest.fixture(scope="module")
def job(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every sharded case in one 2-process gloo job (one start-up)."""
    from runtime.verify import launch

    cases: list[dict[str, Any]] = [
        {"name": f"{family}_{_name(lay)}", "run": _run(checkpoints[family], lay, NPROC), "logits": {"seed": 1, "batch": 2}}
        for family, layouts in LAYOUTS.items() for lay in layouts
    ]
    resume = _run(checkpoints["llama"], {"zero_stage": 3}, NPROC, training={"optimizer": "adamw"})
    cases += [
        {"name": "resume_full_run", "run": resume, "steps": 4},
        {"name": "resume_resumed", "run": resume, "steps": 4, "resume_at": 2},
        {"name": "lora_fsdp2", "run": _run(checkpoints["qwen2"], {"zero_stage": 3}, NPROC,
                                           training={"method": "lora", "lora_rank": 4}), "steps": 2},
    ]
    out = tmp_path_factory.mktemp("ckpt-job") / "out"
    proc = launch(cases, NPROC, out)
    if proc.returncode != 0:
        pytest.fail(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("family", "layout"), [(f, lay) for f, ls in LAYOUTS.items() for lay in ls],
                         ids=[f"{f}-{_name(lay)}" for f, ls in LAYOUTS.items() for lay in ls])
def test_sharded_layouts_give_transformers_logits(job: Path, family: str, layout: dict[str, Any]) -> None:
    from runtime.verify import load_results

    ranks = load_results(job, f"{family}_{_name(layout)}", NPROC)
    got = [r["logits"] for r in ranks if r["logits"] is not None]
    assert len(got) == (1 if layout.get("pp") else NPROC)  # the last stage's ranks hold the logits
    ref = _reference_logits(family)
    for logits in got:
        torch.testing.assert_close(logits, ref, rtol=0, atol=LOGITS_ATOL)
    print(f"{family} {_name(layout)}: max |logit - transformers'| {max((g - ref).abs().max().item() for g in got):.2e}")


@pytest.mark.slow
def test_resume_from_the_distributed_checkpoint_continues_the_loss_curve(job: Path) -> None:
    from runtime.verify import load_results

    full = load_results(job, "resume_full_run", NPROC)
    resumed = load_results(job, "resume_resumed", NPROC)
    for f, r in zip(full, resumed, strict=True):
        assert r["start_step"] == 2
        assert r["losses"] == f["losses"][2:]
        for k, v in r["params"].items():
            assert torch.equal(v, f["params"][k]), k


@pytest.mark.slow
def test_lora_on_a_loaded_base_matches_one_process(job: Path, checkpoints: dict[str, Path]) -> None:
    from runtime.verify import load_results

    one = train(load_run_spec(_run(checkpoints["qwen2"], training={"method": "lora", "lora_rank": 4})), steps=2)
    for r in load_results(job, "lora_fsdp2", NPROC):
        for a, b in zip(r["losses"], one.losses, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b)
