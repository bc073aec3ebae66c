"""runtime.gloo_comms on 3 gloo ranks (spawned processes): the in-place reduce-scatter and the
point-to-point all-gather give torch's results, and neither allocates a tensor, where gloo's own
reduce-scatter allocates a clone of its whole input (the live-storage tracker, runtime.memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

pytestmark = pytest.mark.slow

WORLD = 3
SHARD = 5  # elements per rank


def _extra_bytes(fn, *tensors) -> int:
    """Peak bytes of new tensor storage while `fn` runs, `tensors` already counted."""
    from runtime.memory import LiveStorageTracker

    tracker = LiveStorageTracker()
    with tracker:
        tracker.track(*tensors)
        tracker.reset_peak()
        before = tracker.live_bytes
        fn()
    return tracker.peak_bytes - before


def _ranks(rank: int, store_path: str) -> None:
    from runtime.gloo_comms import InPlaceReduceScatter, PointToPointAllGather

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD)
    group = dist.group.WORLD
    try:
        full = torch.arange(WORLD * SHARD, dtype=torch.float32) * (rank + 1)
        expected = torch.empty(SHARD)
        dist.reduce_scatter_tensor(expected, full.clone(), group=group)
        for op, scale in ((dist.ReduceOp.SUM, 1.0), (dist.ReduceOp.AVG, 1.0 / WORLD)):
            inp, out = full.clone(), torch.empty(SHARD)
            extra = _extra_bytes(lambda: InPlaceReduceScatter()(out, inp, group, op), inp, out)  # noqa: B023
            torch.testing.assert_close(out, expected * scale)
            assert extra == 0, (str(op), extra)
        inp, out = full.clone(), torch.empty(SHARD)
        gloo_extra = _extra_bytes(lambda: dist.reduce_scatter_tensor(out, inp, group=group), inp, out)
        assert gloo_extra == inp.nbytes, gloo_extra  # gloo's clone of the input

        shard = torch.full((SHARD,), float(rank + 1))
        expected = torch.empty(WORLD * SHARD)
        dist.all_gather_into_tensor(expected, shard, group=group)
        out = torch.empty(WORLD * SHARD)
        extra = _extra_bytes(lambda: PointToPointAllGather()(out, shard, group), out, shard)
        torch.testing.assert_close(out, expected)
        assert extra == 0, extra
        out = torch.zeros(WORLD * SHARD)  # FSDP2's layout: the input is this rank's chunk of the output
        own = out.view(WORLD, -1)[rank]
        own.fill_(float(rank + 1))
        PointToPointAllGather()(out, own, group)
        torch.testing.assert_close(out, expected)
    finally:
        dist.destroy_process_group()


def test_gloo_comms_match_torch_without_allocating(tmp_path: Path) -> None:
    mp.spawn(_ranks, args=(str(tmp_path / "store"),), nprocs=WORLD, join=True)
