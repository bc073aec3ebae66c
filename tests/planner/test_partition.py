"""CP-SAT stage partition: each constraint on tiny instances, brute force on small ones, and the
cost model's verdict on presets whose layer count does not split evenly."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from cluster_specs.presets import get_cluster
from cost_models.estimate import estimate
from cost_models.layout import Layout, validate_layout
from cost_models.stages import StagePartition
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.partition import (
    PartitionData,
    build_partition_data,
    evaluate,
    fit_recompute,
    optimize_partition,
    partition_layers,
)

MS = 1e-3


def tiny(
    layers: int = 8,
    pp: int = 2,
    vpp: int = 1,
    *,
    t: float = 10 * MS,
    rt: float = 3 * MS,
    states: float = 100,
    acts: float = 50,
    acts_full: float = 5,
    in_flight: tuple[float, ...] | None = None,
    capacity: float = math.inf,
    **kw,
) -> PartitionData:
    """Identical layers; bytes are small integers so every bound is exact."""
    return PartitionData(
        pp=pp,
        vpp=vpp,
        layer_time_s=(t,) * layers,
        layer_recompute_time_s=(rt,) * layers,
        layer_state_bytes=(states,) * layers,
        layer_activation_bytes=(acts,) * layers,
        layer_recompute_activation_bytes=(acts_full,) * layers,
        in_flight=in_flight or (1.0,) * pp,
        capacity_bytes=capacity,
        **kw,
    )


def solve(data: PartitionData, **kw):
    return partition_layers(data, byte_resolution=1, **kw)


# ---- each constraint -----------------------------------------------------------------------


def test_an_uneven_optimum_is_proved_quickly() -> None:
    """126 identical layers over 8 ranks x 8 chunks: a rank must hold 16; the pigeonhole bound in
    `_slowest_rank` proves it (the fractional mean, 15.75 layers, never closes the gap)."""
    res = solve(tiny(126, 8, 8), work_limit=0.05)
    assert res.status == "optimal" and res.max_stage_time_s == pytest.approx(16 * 10 * MS)


@pytest.mark.parametrize(("layers", "pp", "vpp"), [(8, 2, 1), (7, 3, 1), (12, 2, 3), (5, 5, 1), (6, 3, 2)])
def test_contiguous_cut_with_at_least_one_layer_per_chunk(layers: int, pp: int, vpp: int) -> None:
    res = solve(tiny(layers, pp, vpp))
    assert res.status == "optimal"
    assert len(res.chunk_layers) == pp * vpp
    assert sum(res.chunk_layers) == layers
    assert min(res.chunk_layers) >= 1
    # identical layers, no extras: the slowest rank holds ceil(L / pp) layers
    assert res.max_stage_time_s == pytest.approx(math.ceil(layers / pp) * 10 * MS)
    part = res.stage_partition(pp, vpp)
    assert sorted(i for r in range(pp) for i in part.rank_layers(r)) == list(range(layers))


def test_fewer_layers_than_chunks_is_infeasible() -> None:
    res = solve(tiny(3, pp=2, vpp=2))
    assert res.status == "infeasible"
    assert not res.ok and res.chunk_layers == ()
    assert "4 chunks need at least 4 layers" in res.message


def test_one_rank() -> None:
    res = solve(tiny(6, pp=1, head_time_s=5 * MS))
    assert res.chunk_layers == (6,)
    assert res.max_stage_time_s == pytest.approx(65 * MS)


def test_memory_cap_binds_and_moves_layers() -> None:
    # 1F1B: rank 0 holds 2 micro-batches in flight, rank 1 one. 8 layers: even is 4 + 4.
    free = tiny(8, in_flight=(2.0, 1.0))
    assert solve(free).chunk_layers == (4, 4)
    # rank 0 needs 100 + 2 x 50 = 200 bytes per layer, rank 1 150: with 750 bytes rank 0 holds
    # at most 3 layers and rank 1 at most 5
    tight = dataclasses.replace(free, capacity_bytes=750)
    res = solve(tight)
    assert res.status == "optimal"
    assert res.chunk_layers == (3, 5)
    assert res.rank_bytes == pytest.approx((600, 750))
    assert res.max_stage_time_s == pytest.approx(50 * MS)
    _, even_bytes = evaluate(tight, (4, 4))
    assert even_bytes[0] > 750  # the even cut would not fit


def test_recompute_only_when_memory_needs_it() -> None:
    free = tiny(8, in_flight=(2.0, 1.0), recompute="per_rank")
    res = solve(free)
    assert res.recompute_per_rank == (0, 0)
    assert res.max_stage_time_s == pytest.approx(40 * MS)

    # 4 layers on rank 0 need 800 bytes; each recomputed layer saves 2 x (50 - 5) = 90 bytes.
    # Capacity 700: recomputing 2 layers (620 bytes, +6 ms) beats moving a layer (+10 ms).
    tight = dataclasses.replace(free, capacity_bytes=700)
    res = solve(tight)
    assert res.chunk_layers == (4, 4)
    assert res.recompute_per_rank == (2, 0)  # only the rank that needs it, only as much as needed
    assert res.max_stage_time_s == pytest.approx(46 * MS)
    assert max(res.rank_bytes) <= 700


def test_recompute_working_set_counts_on_recomputing_ranks_only() -> None:
    free = tiny(8, in_flight=(2.0, 1.0), recompute="per_rank", layer_working_bytes=(60.0,) * 8)
    # with the 60-byte working set, 2 recomputed layers need 620 + 60 = 680 bytes
    res = solve(dataclasses.replace(free, capacity_bytes=680))
    assert res.recompute_per_rank == (2, 0)
    assert res.rank_bytes[0] == pytest.approx(680)
    # one byte less and it needs a third layer recomputed
    res = solve(dataclasses.replace(free, capacity_bytes=679))
    assert res.recompute_per_rank == (3, 0)


def test_uniform_recompute_shares_one_count() -> None:
    data = tiny(8, in_flight=(2.0, 1.0), recompute="uniform", capacity=700)
    res = solve(data)
    assert res.recompute_layers == 2
    assert res.recompute_per_rank == (2, 2)  # both ranks recompute K layers (rank 1 did not need to)
    pinned = solve(dataclasses.replace(data, recompute_layers=8, capacity_bytes=math.inf))
    assert pinned.recompute_per_rank == (4, 4)  # min(K, layers of the rank)
    assert pinned.max_stage_time_s == pytest.approx(4 * 13 * MS)


def test_recompute_is_a_prefix_of_the_rank_layers() -> None:
    """Rank 0 holds chunks 0 and 2. Layers 4-7 keep 10x the activations of layers 0-3; saving
    memory on rank 0 by recomputing only layer 4 would cost 3 ms, but a rank recomputes a prefix
    of its layers (as Megatron's block method and the cost model count them): 0, 1, then 4."""
    small, big = 10.0, 100.0
    data = dataclasses.replace(
        tiny(8, pp=2, vpp=2, in_flight=(2.0, 1.0), recompute="per_rank", capacity=760, acts_full=1),
        layer_activation_bytes=(small,) * 4 + (big,) * 4,
    )
    res = solve(data)
    assert res.chunk_layers == (2, 2, 2, 2)
    assert res.recompute_per_rank == (3, 0)
    assert res.max_stage_time_s == pytest.approx(49 * MS)  # not 43 ms
    assert res.max_stage_time_s == pytest.approx(brute_force(data))


def test_lm_head_shifts_layers_off_the_last_stage() -> None:
    even = solve(tiny(12, pp=3))
    assert even.chunk_layers == (4, 4, 4)
    res = solve(tiny(12, pp=3, head_time_s=15 * MS))
    assert res.chunk_layers[-1] < 4
    assert res.max_stage_time_s == pytest.approx(50 * MS)  # (5, 5, 2) or (5, 4, 3)... slowest 50 ms
    assert res.max_stage_time_s < max(evaluate(tiny(12, pp=3, head_time_s=15 * MS), (4, 4, 4))[0])


def test_embedding_memory_shifts_layers_off_the_first_stage() -> None:
    data = tiny(12, pp=3, embedding_bytes=300, capacity=800)  # 150 bytes per layer
    res = solve(data)
    assert res.chunk_layers[0] <= 3  # 300 + 3 x 150 = 750 <= 800 < 900
    assert max(res.rank_bytes) <= 800
    assert res.max_stage_time_s == pytest.approx(50 * MS)
    head = tiny(12, pp=3, head_bytes=300, capacity=800)
    assert solve(head).chunk_layers[-1] <= 3


def test_interleaved_chunks_of_a_rank_stay_balanced() -> None:
    res = solve(tiny(12, pp=2, vpp=3, head_time_s=25 * MS))
    for r in range(2):
        own = res.chunk_layers[r::2]
        assert max(own) - min(own) <= 1
    assert res.max_stage_time_s < max(evaluate(tiny(12, pp=2, vpp=3, head_time_s=25 * MS), (2,) * 6)[0])


def test_infeasible_says_how_far() -> None:
    data = tiny(8, in_flight=(2.0, 1.0), capacity=400, recompute="per_rank")
    res = solve(data)
    assert res.status == "infeasible"
    assert res.chunk_layers == ()
    assert res.min_peak_bytes is not None and res.min_peak_bytes > 400
    assert "no cut fits" in res.message


def test_deterministic() -> None:
    data = tiny(10, pp=3, in_flight=(3.0, 2.0, 1.0), recompute="per_rank", capacity=1100)
    assert solve(data).chunk_layers == solve(data).chunk_layers


def test_data_validation() -> None:
    with pytest.raises(ValueError, match="layer_state_bytes"):
        dataclasses.replace(tiny(4), layer_state_bytes=(1.0,))
    with pytest.raises(ValueError, match="recompute_layers"):
        tiny(4, recompute_layers=2)


# ---- brute force ---------------------------------------------------------------------------


def compositions(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(k))


def brute_force(data: PartitionData, spread: int = 1) -> float:
    """Least slowest-rank time over every cut and every recompute choice."""
    best = math.inf
    L, P = data.num_layers, data.pp
    for cut in compositions(L, data.chunks):
        if any(max(cut[r::P]) - min(cut[r::P]) > spread for r in range(P)):
            continue
        counts = StagePartition(cut, P, data.vpp).rank_layer_counts()
        if data.recompute == "none":
            choices = [[0] * P]
        elif data.recompute_layers is not None:
            choices = [[min(data.recompute_layers, n) for n in counts]]
        elif data.recompute == "uniform":
            choices = [[min(k, n) for n in counts] for k in range(L + 1)]
        else:
            choices = [list(ks) for ks in itertools.product(*(range(n + 1) for n in counts))]
        for ks in choices:
            times, mem = evaluate(data, cut, ks)
            if max(mem) <= data.capacity_bytes:
                best = min(best, max(times))
    return best


def random_instance(rng: random.Random, layers: int, pp: int, vpp: int, recompute: str) -> PartitionData:
    kinds = [rng.random() < 0.4 for _ in range(layers)]  # "MoE" layers cost more
    t = tuple(rng.choice((7, 8, 9)) * MS * (2 if k else 1) for k in kinds)
    states = tuple(float(rng.choice((80, 100)) * (3 if k else 1)) for k in kinds)
    acts = tuple(float(rng.choice((40, 60)) * (2 if k else 1)) for k in kinds)
    in_flight = tuple(float(pp - r) for r in range(pp))
    data = PartitionData(
        pp=pp,
        vpp=vpp,
        layer_time_s=t,
        layer_recompute_time_s=tuple(x / 3 for x in t),
        layer_state_bytes=states,
        layer_activation_bytes=acts,
        layer_recompute_activation_bytes=tuple(a // 8 for a in acts),
        in_flight=in_flight,
        capacity_bytes=math.inf,
        rank_time_s=tuple(float(rng.choice((0, 1, 2))) * MS for _ in range(pp)),
        rank_bytes=tuple(float(rng.choice((0, 50))) for _ in range(pp)),
        embedding_bytes=float(rng.choice((0, 120))),
        head_time_s=rng.choice((0, 12)) * MS,
        head_bytes=float(rng.choice((0, 150))),
        layer_working_bytes=tuple(float(a) for a in acts),
        recompute=recompute,  # type: ignore[arg-type]
    )
    # a capacity between the tightest and the roomiest even cut, so memory matters
    even = StagePartition.even(layers, pp, vpp).chunk_layers
    loose = max(evaluate(data, even)[1])
    return dataclasses.replace(data, capacity_bytes=float(round(loose * rng.uniform(0.6, 1.05))))


BRUTE_CASES = [
    (layers, pp, vpp, mode)
    for layers, pp, vpp in [(6, 2, 1), (7, 3, 1), (8, 2, 2), (8, 4, 1), (9, 3, 1), (10, 2, 1), (10, 4, 1), (8, 3, 2), (10, 2, 3)]
    for mode in ("none", "per_rank", "uniform")
]


@pytest.mark.parametrize(("layers", "pp", "vpp", "mode"), BRUTE_CASES)
def test_matches_brute_force(layers: int, pp: int, vpp: int, mode: str) -> None:
    rng = random.Random(f"{layers}-{pp}-{vpp}-{mode}")
    for _ in range(3):
        data = random_instance(rng, layers, pp, vpp, mode)
        if mode == "per_rank" and pp * vpp >= 8 and layers >= 10:
            continue  # brute force too slow
        expected = brute_force(data)
        res = solve(data, time_limit_s=5.0)
        if math.isinf(expected):
            assert res.status == "infeasible"
            continue
        assert res.status == "optimal", res.message
        assert res.max_stage_time_s == pytest.approx(expected, abs=1e-9)
        times, mem = evaluate(data, res.chunk_layers, res.recompute_per_rank)
        assert max(mem) <= data.capacity_bytes
        assert max(times) == pytest.approx(res.max_stage_time_s)


def tie_break_brute_force(data: PartitionData) -> tuple[float, float]:
    """(least total recompute seconds, then least worst-rank bytes) among the cuts that reach the
    least slowest-rank time: what phase 2 minimizes."""
    fastest = brute_force(data)
    P, best = data.pp, (math.inf, math.inf)
    for cut in compositions(data.num_layers, data.chunks):
        if any(max(cut[r::P]) - min(cut[r::P]) > 1 for r in range(P)):
            continue
        part = StagePartition(cut, P, data.vpp)
        counts = part.rank_layer_counts()
        choices = (
            [[0] * P] if data.recompute == "none"
            else [[min(k, n) for n in counts] for k in range(data.num_layers + 1)] if data.recompute == "uniform"
            else [list(ks) for ks in itertools.product(*(range(n + 1) for n in counts))]
        )
        for ks in choices:
            times, mem = evaluate(data, cut, ks)
            if max(mem) > data.capacity_bytes or max(times) > fastest + 1e-9:
                continue
            redo = sum(data.layer_recompute_time_s[i] for r in range(P) for i in part.rank_layers(r)[: ks[r]])
            best = min(best, (round(redo, 9), max(mem)))
    return best


@pytest.mark.parametrize(("layers", "pp", "vpp", "mode"), [
    (8, 2, 2, "none"), (9, 3, 1, "per_rank"), (10, 2, 1, "uniform"), (8, 4, 1, "per_rank"), (10, 2, 3, "none"),
])
@pytest.mark.parametrize("gap", [0, 40])
def test_tie_break_is_least_recompute_then_headroom_within_the_gap(
    layers: int, pp: int, vpp: int, mode: str, gap: int
) -> None:
    """Phase 2 at the slowest rank's least time: the least recompute exactly, and a worst-rank
    memory at most `HEADROOM_GAP_BYTES` above the least (exactly the least with no gap)."""
    rng = random.Random(f"tie-{layers}-{pp}-{vpp}-{mode}")
    checked = 0
    for _ in range(4):
        data = random_instance(rng, layers, pp, vpp, mode)
        least_redo, least_peak = tie_break_brute_force(data)
        if math.isinf(least_peak):
            continue
        res = solve(data, time_limit_s=5.0, headroom_gap_bytes=gap)
        part = StagePartition(res.chunk_layers, pp, vpp)
        redo = sum(data.layer_recompute_time_s[i] for r in range(pp) for i in part.rank_layers(r)[: res.recompute_per_rank[r]])
        assert redo == pytest.approx(least_redo, abs=1e-8)
        assert least_peak <= max(res.rank_bytes) <= least_peak + gap
        checked += 1
    assert checked


def test_fit_recompute_is_least() -> None:
    data = tiny(8, in_flight=(2.0, 1.0), recompute="per_rank", capacity=700)
    assert fit_recompute(data, (4, 4)) == [2, 0]
    assert fit_recompute(dataclasses.replace(data, recompute="uniform"), (4, 4)) == [2, 2]
    assert fit_recompute(dataclasses.replace(data, recompute="none"), (4, 4)) is None


# ---- data from the cost models ---------------------------------------------------------------

H100 = get_cluster("dgx-h100")
TRAIN = TrainingSpec(seq_len=4096, global_batch=1024)


def _layout(model: str, gpus: int, **kw) -> Layout:
    lay = Layout(micro_batch=1, **kw)
    problems = validate_layout(get_model(model), TRAIN, gpus, lay)
    assert not problems, problems
    return lay


CONSISTENCY = [
    ("llama3-70b", 64, dict(tp=8, pp=4, recompute="selective")),
    ("llama3-70b", 64, dict(tp=4, pp=4, zero_stage=2)),
    ("llama3-70b", 64, dict(tp=4, pp=4, zero_stage=3)),
    ("llama3-70b", 64, dict(tp=4, pp=4, cp=2)),
    ("llama3-70b", 64, dict(tp=8, pp=4, zero_stage=0, recompute="full", recompute_layers=3)),
    ("qwen3-0.6b", 32, dict(pp=4)),
    ("qwen3-0.6b", 32, dict(zero_stage=3)),
    ("mixtral-8x7b", 64, dict(tp=2, pp=4, vpp=2, ep=4)),
    ("deepseek-v3", 512, dict(tp=8, pp=8, ep=8, recompute="full")),
    ("gpt-oss-120b", 64, dict(tp=2, pp=4, ep=4, zero_stage=3, offload_optimizer=True)),
]


@pytest.mark.parametrize(("model", "gpus", "kw"), CONSISTENCY)
def test_data_reproduces_the_cost_model(model: str, gpus: int, kw: dict) -> None:
    """The linear model prices the even cut, and every cut one layer away from it, as
    `cost_models.estimate` does (time per micro-batch to 1e-4: a rank's collectives run at the
    atlas's measured size ratio of their bytes, `cost_models.comm.size_ratio`, which moves slightly
    with the layers a cut gives the rank; memory of every rank but the last exactly). The
    last rank's loss peak (logits) and a layer's backward peak (ZeRO-3 buffers, recompute working
    set) do not coincide; the cost model takes the larger, the linear model sums them: there it is
    an upper bound, above the cost model by at most the smaller of the two."""
    m = get_model(model)
    lay = _layout(model, gpus, **kw)
    data = build_partition_data(m, TRAIN, H100, gpus, lay)
    res = lay.resolved(gpus, TRAIN)
    ks = None if res.recompute != "full" else [res.recompute_layers or m.num_layers] * res.pp
    even = StagePartition.even(m.num_layers, res.pp, res.vpp).chunk_layers
    cuts = [even]
    for a, b in itertools.permutations(range(len(even)), 2):
        if even[a] > 1:
            moved = list(even)
            moved[a] -= 1
            moved[b] += 1
            cuts.append(tuple(moved))
    for cut in cuts[:12]:
        est = estimate(m, TRAIN, H100, gpus, lay, StagePartition(cut, res.pp, res.vpp))
        times, mem = evaluate(data, cut, ks)
        assert times == pytest.approx(list(est.stage_times_s), rel=1e-4)
        want = [x.total for x in est.memory]
        assert mem[:-1] == pytest.approx(want[:-1], rel=1e-9)
        last = est.memory[-1]
        layer_phase = max(data.layer_working_bytes, default=0.0) + max(x.comm_buffers for x in est.memory)
        slack = min(last.logits, layer_phase) * 1.1 + 1.0  # x (1 + fragmentation)
        assert want[-1] * (1 - 1e-9) <= mem[-1] <= want[-1] + slack


UNEVEN = [
    # (preset, gpus, layout): layer counts that pp does not divide, plus interleaved cases
    ("llama3-405b", 512, dict(tp=8, pp=8, recompute="full")),
    ("llama3-405b", 512, dict(tp=8, pp=16)),
    ("deepseek-v3", 512, dict(tp=8, pp=8, ep=8, recompute="full")),
    ("deepseek-v3", 1024, dict(tp=8, pp=16, ep=8, recompute="full")),
    ("gpt3-175b", 320, dict(tp=8, pp=10, recompute="selective")),
    ("nemotron-4-340b", 640, dict(tp=8, pp=10, recompute="full")),
    ("mixtral-8x7b", 96, dict(tp=2, pp=6, ep=8)),
    ("mixtral-8x22b", 384, dict(tp=4, pp=6, ep=8, recompute="full")),
    ("qwen3-235b-a22b", 256, dict(tp=4, pp=4, ep=16, recompute="full")),
    ("gpt-oss-120b", 128, dict(tp=2, pp=8, ep=8)),
    ("llama3-70b", 192, dict(tp=8, pp=6)),
    ("llama3-70b", 128, dict(tp=8, pp=4, vpp=5)),
    ("gpt3-175b", 256, dict(tp=8, pp=8, vpp=3, recompute="selective")),
    ("qwen3-30b-a3b", 80, dict(pp=10, ep=8)),
    ("llama3-8b", 48, dict(pp=6)),
]


@pytest.mark.parametrize(("model", "gpus", "kw"), UNEVEN)
def test_cpsat_never_worse_than_even(model: str, gpus: int, kw: dict) -> None:
    m = get_model(model)
    lay = _layout(model, gpus, **kw)
    even = estimate(m, TRAIN, H100, gpus, lay)
    assert even.fits
    part = optimize_partition(m, TRAIN, H100, gpus, lay)
    assert part is not None
    est = estimate(m, TRAIN, H100, gpus, lay, part)
    assert est.fits
    assert max(est.stage_times_s) <= max(even.stage_times_s) * (1 + 1e-9)


def test_cpsat_beats_even_when_the_head_is_heavy() -> None:
    # gpt-oss-120b: a 201k vocabulary makes the LM head worth more than a layer
    m = get_model("gpt-oss-120b")
    lay = _layout("gpt-oss-120b", 128, tp=2, pp=8, ep=8)
    part = optimize_partition(m, TRAIN, H100, 128, lay)
    assert part is not None and part.chunk_layers[-1] < 4
    even = estimate(m, TRAIN, H100, 128, lay)
    better = estimate(m, TRAIN, H100, 128, lay, part)
    assert max(better.stage_times_s) < 0.9 * max(even.stage_times_s)
    assert better.step_s < even.step_s


def test_optimize_partition_single_stage_is_none() -> None:
    assert optimize_partition(get_model("llama3-8b"), TRAIN, H100, 8, _layout("llama3-8b", 8)) is None


def test_build_data_recompute_modes() -> None:
    m = get_model("llama3-70b")
    lay = _layout("llama3-70b", 64, tp=8, pp=4, recompute="full", recompute_layers=5)
    data = build_partition_data(m, TRAIN, H100, 64, lay)
    assert (data.recompute, data.recompute_layers) == ("uniform", 5)
    free = build_partition_data(m, TRAIN, H100, 64, lay, recompute="per_rank")
    assert free.recompute == "per_rank" and free.recompute_layers is None
    assert all(x > 0 for x in free.layer_recompute_time_s)
    assert all(a > f for a, f in zip(free.layer_activation_bytes, free.layer_recompute_activation_bytes, strict=True))
    none = build_partition_data(m, TRAIN, H100, 64, _layout("llama3-70b", 64, tp=8, pp=4))
    assert none.recompute == "none"
    assert none.head_time_s > 0 and none.head_bytes > 0 and none.embedding_bytes > 0


def test_per_rank_recompute_on_a_preset_fits_a_smaller_gpu() -> None:
    """With 60 GiB instead of 80 GiB, llama3-405b at pp=8 keeps running by recomputing layers
    where the 1F1B warm-up keeps the most micro-batches (the first ranks)."""
    m = get_model("llama3-405b")
    lay = _layout("llama3-405b", 512, tp=8, pp=8)
    data = build_partition_data(m, TRAIN, H100, 512, lay, recompute="per_rank", capacity_bytes=60 * 2**30)
    res = partition_layers(data)
    assert res.ok
    assert max(res.rank_bytes) <= 60 * 2**30
    ks = res.recompute_per_rank
    assert ks[0] > 0 and ks[-1] == 0
    assert list(ks) == sorted(ks, reverse=True)


def test_even_cut_is_the_fallback_when_the_search_finds_nothing() -> None:
    from planner.partition import _even_fallback

    data = tiny(8, in_flight=(2.0, 1.0), recompute="per_rank", capacity=700)
    res = _even_fallback(data, 0.1, "the solver found no cut within 0.5 s")
    assert res.status == "feasible" and res.ok
    assert res.chunk_layers == (4, 4) and res.recompute_per_rank == (2, 0)
    assert "returning the even cut" in res.message
    tight = dataclasses.replace(data, capacity_bytes=400)
    assert _even_fallback(tight, 0.1, "no cut").status == "unknown"


def test_work_limit_is_reproducible() -> None:
    data = tiny(12, pp=3, vpp=2, in_flight=(3.0, 2.0, 1.0), recompute="per_rank", capacity=1500, head_time_s=8 * MS)
    a = partition_layers(data, byte_resolution=1, work_limit=0.5, time_limit_s=30)
    b = partition_layers(data, byte_resolution=1, work_limit=0.5, time_limit_s=30)
    assert (a.status, a.chunk_layers, a.recompute_per_rank) == (b.status, b.chunk_layers, b.recompute_per_rank)


def _burn(stop) -> None:  # a busy CPU for the loaded solve
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def test_same_cut_on_a_loaded_machine() -> None:
    """The default stop is deterministic work, not wall clock: a busy CPU changes how long the
    solver takes, never what it answers (issue: plans depended on machine load)."""
    import multiprocessing as mp

    data = tiny(12, pp=3, vpp=2, in_flight=(3.0, 2.0, 1.0), recompute="per_rank", capacity=1500, head_time_s=8 * MS)
    quiet = partition_layers(data, byte_resolution=1)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    burners = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(3)]
    for p in burners:
        p.start()
    try:
        loaded = [partition_layers(data, byte_resolution=1) for _ in range(3)]
    finally:
        stop.set()
        for p in burners:
            p.join(10)
    for res in loaded:
        assert (res.status, res.chunk_layers, res.recompute_per_rank) == (
            quiet.status, quiet.chunk_layers, quiet.recompute_per_rank
        )
