import pytest

from cost_models.stages import StagePartition, even_partition


def test_even_partition_sums_and_balances() -> None:
    for layers in (1, 7, 32, 61, 126):
        for chunks in range(1, min(layers, 20) + 1):
            parts = even_partition(layers, chunks)
            assert sum(parts) == layers
            assert max(parts) - min(parts) <= 1


def test_remainder_goes_to_middle() -> None:
    assert even_partition(10, 4) == (2, 3, 3, 2)


def test_rank_layers_interleaved() -> None:
    part = StagePartition.even(8, pp=2, vpp=2)  # chunks of 2 layers: [0,1] [2,3] [4,5] [6,7]
    assert part.rank_layers(0) == [0, 1, 4, 5]
    assert part.rank_layers(1) == [2, 3, 6, 7]


def test_bad_partition() -> None:
    with pytest.raises(ValueError, match="chunks given"):
        StagePartition((4, 4), pp=4)
    with pytest.raises(ValueError):
        even_partition(3, 4)


def test_v_shape_partition_puts_the_head_on_rank_zero() -> None:
    from cost_models.layout import Layout

    part = StagePartition.for_layout(16, Layout(pp=4, vpp=2, schedule="zbv", framework="fsdp"))
    assert part.v_shape and part.head_rank == 0
    assert part.chunk_ranks == (0, 1, 2, 3, 3, 2, 1, 0)
    assert part.rank_layers(0) == [0, 1, 14, 15]
    assert part.rank_layers(3) == [6, 7, 8, 9]
    looped = StagePartition.for_layout(16, Layout(pp=4, vpp=2))
    assert not looped.v_shape and looped.head_rank == 3 and looped.rank_layers(0) == [0, 1, 8, 9]
    with pytest.raises(ValueError, match="two chunks per rank"):
        StagePartition((4, 4, 4, 4, 4, 4), 2, 3, v_shape=True)
