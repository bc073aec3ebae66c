"""Layout-independent initial weights (runtime/weights.py): a rank's shard, drawn tile by tile from
the seed and the parameter's global name, equals the slice of the single-process model's tensor.

One process plays one rank of a planned world through a fake process group (the shards' shapes
and offsets are real; no collective runs): the last rank of the world, whose shards sit at
non-zero offsets in every sharded dim."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from runtime.model import build_model  # noqa: E402
from runtime.spec import load_run_spec  # noqa: E402
from runtime.weights import TILE, SeededInit, local_box  # noqa: E402


@contextlib.contextmanager
def _fake_rank(rank: int, world: int) -> Iterator[None]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_box_of_tiles_equals_the_slice_of_the_whole() -> None:
    """Boxes that cut tiles on every edge (rows and columns not multiples of the tile)."""
    rows, cols = 37, 3 * TILE["cpu"][1] + 5
    whole = torch.empty(rows, cols)
    init = SeededInit(3, {id(whole): "w"})
    init.normal_(whole, 0.02)
    assert whole.std().item() == pytest.approx(0.02, rel=0.02)
    for r0, nr, c0, nc in [(0, rows, 0, cols), (5, 11, 0, cols), (9, 3, 700, 2500), (36, 1, cols - 7, 7)]:
        got = torch.empty(nr, nc)
        SeededInit._fill_box(got, (r0, nr, c0, nc), rows, cols, *TILE["cpu"], init._key("w"),
                             lambda buf, g: buf.normal_(0.0, 0.02, generator=g))
        assert torch.equal(got, whole[r0 : r0 + nr, c0 : c0 + nc])


def test_values_depend_on_the_name_and_the_seed() -> None:
    a, b, c = torch.empty(4, 8), torch.empty(4, 8), torch.empty(4, 8)
    SeededInit(0, {id(a): "x", id(b): "y"}).normal_(a, 1.0)
    SeededInit(0, {id(b): "y"}).normal_(b, 1.0)
    SeededInit(1, {id(c): "x"}).normal_(c, 1.0)
    assert not torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    ("model", "layout"),
    [
        ("tiny", {"tp": 2, "zero_stage": 3}),  # column / row parallel under FSDP (_StridedShard)
        ("tiny", {"pp": 2, "zero_stage": 3}),  # the second pipeline stage's layers
        ("tiny-moe", {"ep": 2, "zero_stage": 3}),  # experts on dim 0, FSDP's dim-1 fallback
        ("tiny", {"zero_stage": 0}),  # replicated (DDP-style)
    ],
)
def test_a_rank_holds_the_slices_of_the_single_process_weights(model: str, layout: dict) -> None:
    from runtime.mesh import build_meshes
    from runtime.parallelize import build_parts

    run = load_run_spec({
        "model": model, "training": {"seq_len": 32, "global_batch": 8}, "gpus": 4, "layout": layout, "seed": 5,
    })
    reference = dict(build_model(run.model, seed=run.seed).named_parameters())
    with _fake_rank(3, 4):
        parts = build_parts(run, build_meshes(run.layout, "cpu"), torch.device("cpu"))
        checked = 0
        for chunk in parts.chunks:
            for name, p in chunk.named_parameters():
                name = name.replace("_checkpoint_wrapped_module.", "")
                local, gshape, offset = local_box(p)
                full = reference[name]
                assert tuple(full.shape) == gshape, name
                idx = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
                assert torch.equal(local, full[idx]), name
                checked += local.numel()
    total = sum(t.numel() for t in reference.values())
    # a shard, not the model (ZeRO-0 replicates every weight)
    assert 0 < checked == total if run.layout.zero_stage == 0 else 0 < checked < total
