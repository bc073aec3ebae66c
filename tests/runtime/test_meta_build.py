"""A rank of a Llama-3-70B or Llama-3.1-405B plan builds on one CPU with host memory bounded by its
shard, not by the model (runtime.fake_world.measure_build: a fake process group at the planned world
size, the whole model on the meta device, only the rank's shards materialised and initialised).

Before the runtime built on the meta device every rank built the whole model in float32 first:
263 GiB for Llama-3-70B, 1,512 GiB for Llama-3.1-405B. `bench/fake_world_memory.py --build` runs the
plans at their real sizes (shards of 1-1.5 GiB); these use more ranks so their shards stay small."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from runtime.spec import load_run_spec  # noqa: E402

PROCESS_SLACK = 96 * 2**20
"""Resident memory a build may add beyond its shards (bytes): the meta model's Python objects, the
meshes, FSDP2's bookkeeping and allocator slack. Measured: 37-47 MiB (these builds and the
plans of `bench/fake_world_memory.py --build`)."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "gpus", "layout"),
    [
        ("llama3-70b", 2048, {"tp": 8, "pp": 16, "zero_stage": 1}),  # FSDP over 16 inside each stage
        ("llama3-405b", 4096, {"tp": 8, "pp": 16, "zero_stage": 3}),  # FSDP over 32
    ],
)
def test_a_rank_holds_its_shard_not_the_model(model: str, gpus: int, layout: dict) -> None:
    from runtime.fake_world import measure_builds

    run = load_run_spec({"model": model, "training": {"seq_len": 8192, "global_batch": 512}, "gpus": gpus,
                         "layout": layout, "dtype": "fp32"})
    shards = run.layout.tp * run.layout.pp * run.layout.dp_ * run.layout.cp
    for b in measure_builds(run, [0, run.layout.pp - 1]):  # the embedding's stage and the LM head's
        assert b.local_bytes < 2 * b.model_bytes / shards, b  # its shard (a first or last stage holds a table more)
        assert b.rss_growth_bytes <= b.local_bytes + PROCESS_SLACK, b  # ... and nothing of the model beyond it
