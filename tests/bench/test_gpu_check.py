"""bench.gpu_check --tiny: the GPU check's code path on the CPU (the profiler, a save_pretrained
checkpoint, a full and a LoRA run through `autopar run --hf-checkpoint`, predicted beside measured)
writes its result and a valid atlas file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models.kernels.schema import read_atlas_file

pytest.importorskip("transformers")  # the exports-check extra (scripts/test.sh installs it)


@pytest.mark.slow
def test_tiny_mode_writes_predicted_beside_measured(tmp_path: Path) -> None:
    from bench import gpu_check

    out = gpu_check.check(tiny=True, out_dir=tmp_path, steps=2, profile_seconds=30.0)
    result = json.loads(out.read_text())
    assert out.name.startswith("cpu-tiny-") and result["mode"] == "tiny (CPU)"
    atlas = read_atlas_file(tmp_path / result["profile"]["file"])
    assert atlas.gpu == "cpu" and atlas.provenance is not None and atlas.gemm and atlas.attention
    assert result["profile"]["points"] == len(atlas.gemm) + len(atlas.attention) + len(atlas.memory)
    assert [r["run"] for r in result["runs"]] == ["full", "lora"]
    assert [r["method"] for r in result["runs"]] == ["full", "lora"]
    for r in result["runs"]:
        assert r["measured_step_s"] > 0 and r["predicted_step_s"] > 0 and r["predicted_step_s_with_profile"] > 0
        assert r["measured_peak_gib"] > 0 and r["startup_s"] > 0
        assert len(r["step_times_s"]) == 2


def test_the_checkpoint_config_is_the_plans_model() -> None:
    """The LlamaConfig written for a plan reads back (model_specs.hf) as the plan's architecture."""
    pytest.importorskip("torch")
    from bench import gpu_check
    from model_specs.spec import ModelSpec
    from runtime.checkpoint import architecture_differences

    models = [json.loads(f.read_text())["inputs"]["model"] for f in gpu_check.GPU_PLANS.values()]
    config = gpu_check.hf_config(models[0]).to_dict()  # the one checkpoint both runs start from
    assert (config["num_hidden_layers"], config["hidden_size"]) == (16, 4096)
    for model in models:
        assert architecture_differences(config, ModelSpec(**model)) == []
