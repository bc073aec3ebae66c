"""The search's bounds without a StageTable agree with the table's own (`time_lower_bound`) or stay
below it, and the vectorized compute times agree with the scalar cost model: pruning with them is
exact."""

import dataclasses

import numpy as np
import pytest

from cluster_specs.presets import get_cluster
from cost_models import step_time
from cost_models.calibration import default_calibration
from cost_models.compute import ShardGeometry, layer_time, lm_head_times
from cost_models.layout import validate_layout
from cost_models.pipeline import SPLIT_BACKWARD_SCHEDULES
from cost_models.stage_table import build_table, price_memory
from cost_models.stages import StagePartition
from cost_models.step_time import price_time, time_lower_bound
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import SearchConstraints
from planner.search import _bubble_bound, _pair_bounds
from planner.space import PipeOption, Stack, meshes, micro_batches, pipeline_options, settings, to_layout

CASES = [
    # model, cluster, gpus, seq, global batch
    ("llama3-8b", "dgx-h100", 64, 8192, 128),
    ("mixtral-8x7b", "dgx-h100", 64, 4096, 256),
    ("deepseek-v3", "dgx-h800", 256, 4096, 1024),
]
FSDP_CASES = [  # framework fsdp: zero-bubble and V-shape (zbv, dualpipev) options too
    ("llama3-70b", "dgx-h100", 64, 4096, 256),
    ("mixtral-8x7b", "dgx-h100", 64, 4096, 256),  # dualpipev's F&B pairs hide the all-to-alls
]


def _valid_pairs(model, training, cluster, gpus, c, limit):
    out = []
    for mesh in meshes(model, cluster, gpus, c):
        mbs = micro_batches(training, mesh.dp, c)
        if mesh.tp > cluster.domain_size or not mbs:
            continue
        probe = to_layout(mesh, mbs[0], PipeOption(1, "1f1b"), settings(mesh, cluster, c)[0], Stack.of(c))
        if any(v.field in {"dp", "tp", "pp", "cp", "ep", "etp", "sp", "order"} for v in validate_layout(model, training, gpus, probe)):
            continue
        out.append((mesh, mbs))
    step = max(1, len(out) // limit)
    return out[::step]


@pytest.mark.parametrize("name,cluster_name,gpus,seq,batch,framework",
                         [(*case, "megatron") for case in CASES] + [(*case, "fsdp") for case in FSDP_CASES])
def test_pair_bound_equals_table_bound(name, cluster_name, gpus, seq, batch, framework, monkeypatch) -> None:
    """Without the SMs collectives take (`step_time.COMM_SMS` 0) the pair bound is the table's bound
    exactly; with them it stays a lower bound, between the two (it counts only the hidden TP and ring
    attention traffic, layer by layer), and above the bound without them where TP overlap hides
    traffic (Megatron's default with TP)."""
    model, cluster = get_model(name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    c, cal = SearchConstraints(framework=framework), default_calibration()
    schedules = set()
    valid = _valid_pairs(model, training, cluster, gpus, c, limit=25)
    all_mbs = sorted({mb for _, mbs in valid for mb in mbs})
    bounds = _pair_bounds(model, training, cluster, gpus, valid, all_mbs, cal, c.framework, Stack.of(c).attention_kernel)
    with monkeypatch.context() as patched:
        patched.setattr(step_time, "COMM_SMS", 0)
        bounds_no_sms = _pair_bounds(model, training, cluster, gpus, valid, all_mbs, cal, c.framework, Stack.of(c).attention_kernel)
    ov = cal.overlap(c.framework)
    checked = raised = tight_floors = 0
    for index, (mesh, mbs) in enumerate(valid):
        for mb in mbs[:: max(1, len(mbs) // 3)]:
            pair = int(np.flatnonzero((bounds.mesh_of == index) & (bounds.mb_of == mb))[0])
            times = bounds.pair_times(pair)
            times_no_sms = bounds_no_sms.pair_times(pair)
            options = pipeline_options(model, training, mesh, mb, c)
            # every option's bound at once (`_PairTimes.bounds`), and the per-rank floors they add up,
            # which plus each mode's recompute are at most the table's
            ga = training.global_batch // (mb * mesh.dp)
            together, floors = times.bounds(mesh.pp, options, ga, ov)
            together_no_sms, _ = times_no_sms.bounds(mesh.pp, options, ga, ov)
            for at, option in enumerate(options):
                vpp = option.vpp
                layout = to_layout(mesh, mb, option, settings(mesh, cluster, c)[0], Stack.of(c)).resolved(gpus, training)
                table = build_table(model, training, cluster, gpus, layout, StagePartition.for_layout(model.num_layers, layout), cal)
                exact = time_lower_bound(table, vpp, cal)
                with monkeypatch.context() as patched:
                    patched.setattr(step_time, "COMM_SMS", 0)
                    exact_no_sms = time_lower_bound(table, vpp, cal)
                pair_bound, pair_bound_no_sms = together[at], together_no_sms[at]
                table_floors = step_time.mode_rank_floors(table, step_time.phase_arrays(table, vpp, cal))
                assert np.all(floors[at][None, :] + table.recompute <= table_floors * (1 + 1e-12))
                tight_floors += bool(np.any(floors[at][None, :] + table.recompute >= table_floors * (1 - 1e-12)))
                assert pair_bound_no_sms * (1 - 1e-12) <= pair_bound <= exact * (1 + 1e-12)
                raised += pair_bound > pair_bound_no_sms * (1 + 1e-9)
                # the pair bound prices the collectives at their alpha-beta time (exactly affine in the
                # micro-batch), the table with the atlas's measured size ratio (never below 1): below
                # it, and equal where the layout has no ring collective to stretch
                assert pair_bound_no_sms <= exact_no_sms * (1 + 1e-12)
                if not ((option.schedule == "dualpipev" and layout.pp > 1) or option.a2a_overlap):
                    assert pair_bound_no_sms >= 0.5 * exact_no_sms
                    if mesh.tp == 1 and mesh.cp == 1:
                        assert pair_bound_no_sms == pytest.approx(exact_no_sms, rel=1e-12)
                bubble_free = option.schedule in SPLIT_BACKWARD_SCHEDULES
                cheap = _bubble_bound(float(bounds.per_mb_s[pair]), mesh.pp, vpp, layout.grad_accum_, bubble_free)
                # pairs are ranked in conservative units: seconds x (1 + the kernels' margin)
                assert bounds.kappa[pair] >= 1.0
                assert bounds.bound_s[pair] <= cheap * bounds.kappa[pair] * (1 + 1e-12)
                assert cheap <= exact * (1 + 1e-12)
                if bubble_free and layout.pp > 1:  # the bound holds for the priced steps of every knob setting
                    grid = [g for g in settings(mesh, cluster, c) if g.zero_stage < 3]
                    priced = price_time(table, grid, price_memory(table, grid, option.schedule, vpp, cal), vpp, cal)
                    assert priced.step_s.min() >= exact * (1 - 1e-12)
                schedules.add(option.schedule)
                checked += 1
    assert checked > 20
    assert tight_floors > 0
    assert raised > 0 or framework != "megatron"
    if framework == "fsdp":
        assert {"zero_bubble", "zbv", "dualpipev"} <= schedules
    assert ("zero_bubble" in schedules) == (framework == "fsdp")


@pytest.mark.parametrize("name,cluster_name,gpus,seq,batch", CASES)
def test_vectorized_layer_times_match_scalar(name, cluster_name, gpus, seq, batch) -> None:
    model, cluster = get_model(name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    c, cal = SearchConstraints(), default_calibration()
    mesh, mbs = _valid_pairs(model, training, cluster, gpus, c, limit=5)[-1]
    mb_array = np.array(mbs)
    g_all = ShardGeometry.of(mesh, mb_array, seq)
    ab = training.activation_bytes
    for i in (0, model.num_layers - 1):
        vector = layer_time(model, i, g_all, cluster.gpu, training.precision, ab, cal)
        head = lm_head_times(model, g_all, cluster.gpu, "bf16", ab, cal)
        for j, mb in enumerate(mbs):
            g = ShardGeometry.of(mesh, mb, seq)
            scalar = layer_time(model, i, g, cluster.gpu, training.precision, ab, cal)
            # the same float operations, up to the last place of numpy's vectorized exp against
            # math.exp in the kernel atlas's GEMM correction (`kernels.atlas.GemmTable.seconds`)
            assert vector.forward[j] == pytest.approx(scalar.forward, rel=1e-12)
            assert vector.backward[j] == pytest.approx(scalar.backward, rel=1e-12)
            assert vector.attention[j] == pytest.approx(scalar.attention, rel=1e-12)
            assert [h[j] for h in head] == pytest.approx(list(lm_head_times(model, g, cluster.gpu, "bf16", ab, cal)), rel=1e-12)


@pytest.mark.parametrize("name,cluster_name,gpus,seq,batch,framework",
                         [(*CASES[1], "megatron"), (*FSDP_CASES[0], "fsdp")])
def test_mode_bounds_hold_for_every_priced_setting(name, cluster_name, gpus, seq, batch, framework) -> None:
    """`step_time.mode_lower_bounds`: no setting priced with a recompute mode is faster than that
    mode's bound, nor than that bound plus what the setting adds once per step
    (`step_time.once_per_step_floor`), nor than its own bound (`step_time.setting_lower_bounds`),
    which is never below the other two; the first mode's is the table's bound, and full
    recompute's is above it (its recompute forward). The settings' own bounds are tight for some
    and well above the mode's bound for others (ZeRO-3's exposed gathers)."""
    model, cluster = get_model(name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    c, cal = SearchConstraints(framework=framework), default_calibration()
    checked = 0
    tight, raised = [], []  # per setting: its own bound over its step, and over the mode's bound plus once
    for mesh, mbs in _valid_pairs(model, training, cluster, gpus, c, limit=12):
        grid = settings(mesh, cluster, c)
        for option in pipeline_options(model, training, mesh, mbs[0], c):
            layout = to_layout(mesh, mbs[0], option, grid[0], Stack.of(c)).resolved(gpus, training)
            table = build_table(model, training, cluster, gpus, layout, StagePartition.for_layout(model.num_layers, layout), cal)
            bounds = step_time.mode_lower_bounds(table, option.vpp, cal)
            assert bounds[0] == time_lower_bound(table, option.vpp, cal)
            assert bounds[2] > bounds[0]
            timed = price_time(table, grid, price_memory(table, grid, option.schedule, option.vpp, cal), option.vpp, cal)
            assert timed.step_s is not None and timed.knobs is not None
            assert np.all(timed.step_s >= bounds[timed.knobs.mode] * (1 - 1e-12))
            once = step_time.once_per_step_floor(table, timed.knobs, cal)
            assert np.all(once > 0)
            assert np.all(timed.step_s >= (bounds[timed.knobs.mode] + once) * (1 - 1e-12))
            own = step_time.setting_lower_bounds(
                table, timed.knobs, option.vpp, cal, step_time.mode_rank_floors(table, step_time.phase_arrays(table, option.vpp, cal))
            )
            assert np.all(own >= (bounds[timed.knobs.mode] + once) * (1 - 1e-12))
            assert np.all(timed.step_s >= own * (1 - 1e-12))
            tight.append(own / timed.step_s)
            raised.append(own / (bounds[timed.knobs.mode] + once))
            checked += len(grid)
    assert checked > 1000
    tight, raised = np.concatenate(tight), np.concatenate(raised)
    assert tight.max() > 1 - 1e-9  # some settings' steps are their bound
    assert np.quantile(raised, 0.9) > 1.2  # and some bounds well above the mode's


def test_bounded_layouts_leave_the_plan_unchanged(monkeypatch) -> None:
    """Layouts that fit but are bounded instead of timed (`SearchStats.dominated`), and combined-1F1B
    options refused by their activation floor without a table (`SearchStats.floored`), change no
    layout the Plan reports: the same best, alternatives, Pareto front and closest miss as a search
    that prices and times everything. Without the floor the rejections and sentences are the same
    too; with it, the floored options' full-recompute settings are counted under the rule that
    refuses them instead of by their memory."""
    from planner import search as search_module

    model, cluster = get_model("mixtral-8x7b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=256)
    fast = search_module.search(model, training, cluster, 64, refine=False)
    with monkeypatch.context() as patched:
        patched.setattr(search_module, "activation_floor", lambda *a: None)
        unfloored = search_module.search(model, training, cluster, 64, refine=False)
        patched.setattr(search_module, "mode_rank_floors", lambda t, phases: np.zeros((4, t.mesh.pp)))
        patched.setattr(search_module, "setting_lower_bounds", lambda t, knobs, vpp, cal, floors: np.zeros(len(knobs.zero)))
        slow = search_module.search(model, training, cluster, 64, refine=False)
    assert fast.stats.dominated > 1000 and fast.stats.floored > 1000
    assert slow.stats.dominated == 0 and slow.stats.floored == 0 and unfloored.stats.floored == 0
    for key in ("best", "alternatives", "pareto", "closest_miss"):
        assert getattr(fast, key) == getattr(slow, key) == getattr(unfloored, key), key
    assert unfloored.rejections == slow.rejections
    # the sentences but the one that counts the search's work (it names what was bounded)
    assert [w for w in unfloored.why if not w.startswith("Searched")] == [w for w in slow.why if not w.startswith("Searched")]
    same = {"generated", "invalid", "feasible", "faster_than_reference"}
    assert fast.stats.model_dump(include=same) == slow.stats.model_dump(include=same)
    assert fast.stats.pruned + fast.stats.priced == slow.stats.pruned + slow.stats.priced
    assert fast.stats.priced == slow.stats.priced - fast.stats.floored
    reasons = {r.reason: r.count for r in fast.rejections}
    assert reasons[search_module.COMBINED_FULL_RECOMPUTE] > 0


@pytest.mark.parametrize("name,cluster_name,gpus,seq,batch", [CASES[1], CASES[2]])
def test_the_activation_floor_is_below_every_priced_peak(name, cluster_name, gpus, seq, batch) -> None:
    """`stage_table.activation_floor`: no setting of a combined-1F1B option (or its twin) priced
    with a recompute mode other than full holds less than that mode's floor."""
    from cost_models.stage_table import activation_floor

    model, cluster = get_model(name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    c, cal = SearchConstraints(), default_calibration()
    checked = 0
    for mesh, mbs in _valid_pairs(model, training, cluster, gpus, c, limit=30):
        grid = settings(mesh, cluster, c)
        for mb in mbs[:2]:
            for option in pipeline_options(model, training, mesh, mb, c):
                layout = to_layout(mesh, mb, option, grid[0], Stack.of(c), validate=False).resolved(gpus, training)
                partition = StagePartition.for_layout(model.num_layers, layout)
                floor = activation_floor(model, training, cluster, layout, partition, option.schedule, option.vpp, cal)
                assert floor is not None and np.isnan(floor[2])
                table = build_table(model, training, cluster, gpus, layout, partition, cal)
                prices = price_memory(table, grid, option.schedule, option.vpp, cal)
                assert prices.knobs is not None
                modes = prices.knobs.mode
                kept = modes != 2
                assert np.all(prices.peak[kept] >= floor[modes[kept]])
                checked += int(kept.sum())
    assert checked > 1000


@pytest.mark.parametrize("name,cluster_name,gpus,seq,batch", [CASES[1], CASES[2]])
def test_the_floors_saved_bytes_are_the_tables(name, cluster_name, gpus, seq, batch) -> None:
    """`stage_table._layer_saved_bytes`, which the activation floor reads, holds the same floats as
    the saved-bytes rows of `_layer_arrays`, which the tables read."""
    from cost_models.finetune import FineTune
    from cost_models.stage_table import _layer_arrays, _layer_saved_bytes, activation_context

    model, cluster = get_model(name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    c, cal = SearchConstraints(), default_calibration()
    checked = 0
    for mesh, mbs in _valid_pairs(model, training, cluster, gpus, c, limit=20):
        for mb in mbs[:2]:
            layout = to_layout(mesh, mb, PipeOption(1, "1f1b"), settings(mesh, cluster, c)[0], Stack.of(c), validate=False)
            layout = layout.resolved(gpus, training)
            actx = activation_context(training, layout, model)
            g = ShardGeometry.of(layout, mb, seq)
            per_layer, _ = _layer_arrays(model, cluster, training.precision, g, actx, cal, FineTune.of(training, layout.stack))
            saved = _layer_saved_bytes(model, actx)
            for mode in range(4):
                np.testing.assert_array_equal(saved[mode], per_layer[f"a{mode}"])
            checked += 1
    assert checked > 10


def test_a_combined_1f1b_option_has_its_twins_table() -> None:
    """The search builds one table for a pipeline option and its combined-1F1B twin
    (`Layout.moe_a2a_overlap`): `build_table` gives the two the same arrays, only the mesh differs."""
    from dataclasses import fields

    model, cluster = get_model("mixtral-8x7b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=256)
    c, cal = SearchConstraints(), default_calibration()
    compared = 0
    for mesh, mbs in _valid_pairs(model, training, cluster, 64, c, limit=40):
        grid = settings(mesh, cluster, c)
        for option in pipeline_options(model, training, mesh, mbs[0], c):
            if not option.a2a_overlap:
                continue
            twin = option._replace(a2a_overlap=False)
            tables = []
            for o in (option, twin):
                layout = to_layout(mesh, mbs[0], o, grid[0], Stack.of(c), validate=False).resolved(64, training)
                tables.append(build_table(model, training, cluster, 64, layout, StagePartition.for_layout(model.num_layers, layout), cal))
            assert tables[0].mesh.moe_a2a_overlap and not tables[1].mesh.moe_a2a_overlap
            for f in fields(tables[0]):
                if f.name != "mesh":
                    np.testing.assert_array_equal(getattr(tables[0], f.name), getattr(tables[1], f.name), err_msg=f.name)
            compared += 1
    assert compared > 5


@pytest.mark.parametrize("name,cluster_name,gpus,seq,batch,framework",
                         [(*CASES[1], "megatron"), (*CASES[2], "megatron"), (*FSDP_CASES[0], "fsdp")])
def test_a_reordered_table_is_the_built_one(name, cluster_name, gpus, seq, batch, framework) -> None:
    """`stage_table.reorder`: another rank order's table with its communication priced again equals,
    field for field, the table `build_table` gives that order, and its memory prices (which the
    search shares between the orders) are the first order's."""
    from dataclasses import fields

    from cost_models.stage_table import reorder
    from planner.space import ORDERS

    model, cluster = get_model(name), get_cluster(cluster_name)
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    c, cal = SearchConstraints(framework=framework), default_calibration()
    compared = 0
    for mesh, mbs in _valid_pairs(model, training, cluster, gpus, c, limit=40):
        if mesh.pp == 1 or mesh.order != ORDERS[0]:
            continue
        grid = settings(mesh, cluster, c)
        for option in pipeline_options(model, training, mesh, mbs[-1], c)[:3]:
            first = to_layout(mesh, mbs[-1], option, grid[0], Stack.of(c), validate=False).resolved(gpus, training)
            partition = StagePartition.for_layout(model.num_layers, first)
            table = build_table(model, training, cluster, gpus, first, partition, cal)
            prices = price_memory(table, grid, option.schedule, option.vpp, cal)
            for order in ORDERS[1:]:
                other = to_layout(dataclasses.replace(mesh, order=order), mbs[-1], option, grid[0], Stack.of(c), validate=False)
                other = other.resolved(gpus, training)
                built = build_table(model, training, cluster, gpus, other, partition, cal)
                reordered = reorder(table, other, cal)
                for f in fields(built):
                    np.testing.assert_array_equal(getattr(reordered, f.name), getattr(built, f.name), err_msg=f.name)
                again = price_memory(built, grid, option.schedule, option.vpp, cal)
                for f in ("allocated", "reserve", "host_optimizer", "nvme"):
                    np.testing.assert_array_equal(getattr(again, f), getattr(prices, f), err_msg=f)
                compared += 1
    assert compared > 10


def test_a_reordered_table_refuses_other_degrees() -> None:
    """`stage_table.reorder` takes a mesh that differs in its rank order only."""
    from cost_models.stage_table import reorder

    model, cluster = get_model("llama3-8b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=64)
    cal = default_calibration()
    c = SearchConstraints()
    mesh = next(m for m in meshes(model, cluster, 64, c) if m.pp == 2 and m.tp == 2)
    grid = settings(mesh, cluster, c)
    layout = to_layout(mesh, 1, PipeOption(1, "1f1b"), grid[0], Stack.of(c), validate=False).resolved(64, training)
    table = build_table(model, training, cluster, 64, layout, StagePartition.for_layout(model.num_layers, layout), cal)
    wider = to_layout(dataclasses.replace(mesh, tp=4, dp=mesh.dp // 2), 1, PipeOption(1, "1f1b"), grid[0], Stack.of(c), validate=False)
    with pytest.raises(ValueError, match="rank order"):
        reorder(table, wider.resolved(64, training), cal)


def test_sharing_tables_between_rank_orders_leaves_the_plan_unchanged(monkeypatch) -> None:
    """The search's tables, memory prices, their verdicts, phase arrays and what the bounds and step
    times of their settings came to, shared between the rank orders of one mesh's degrees
    (`stage_table.reorder`, `_RankOrders`), give the Plan, its rejections and its counts of a search
    that builds, prices, bounds and times every order's own."""
    from planner import search as search_module

    model, cluster = get_model("mixtral-8x7b"), get_cluster("dgx-h100")
    training = TrainingSpec(seq_len=4096, global_batch=256)
    reordered = []
    real_reorder = search_module.reorder

    def counted(t, mesh, cal):
        reordered.append(mesh.order)
        return real_reorder(t, mesh, cal)

    monkeypatch.setattr(search_module, "reorder", counted)
    outcomes = []
    real_outcome = search_module._RankOrders.outcome

    def recorded(self, same):
        seen, step_s = real_outcome(self, same)
        outcomes.append((seen, step_s is None))
        return seen, step_s

    monkeypatch.setattr(search_module._RankOrders, "outcome", recorded)
    shared = search_module.search(model, training, cluster, 64, refine=False)
    assert len(set(reordered)) > 1
    # orders that place alike share a bounded outcome and timed step seconds both
    assert (True, True) in outcomes and (True, False) in outcomes

    class OwnTables(search_module._RankOrders):
        """Every order builds, prices and judges its own table and times its own phases."""

        def table(self, key, build, mesh, cal):
            return build()

        def memory(self, key, price):
            return price()

        def verdict(self, key):
            return None

        def phases(self, placed, table, vpp, cal):
            phases = step_time.phase_arrays(table, vpp, cal)
            floors = step_time.mode_rank_floors(table, phases)
            return phases, step_time.mode_lower_bounds(table, vpp, cal, phases), floors

        def outcome(self, same):
            return False, None

    monkeypatch.setattr(search_module, "_RankOrders", OwnTables)
    own = search_module.search(model, training, cluster, 64, refine=False)
    for key in ("best", "alternatives", "pareto", "closest_miss", "rejections", "why"):
        assert getattr(shared, key) == getattr(own, key), key
    assert shared.stats.model_dump(exclude={"seconds"}) == own.stats.model_dump(exclude={"seconds"})


def test_floor_counts_kept_back_add_up_as_counted_at_once() -> None:
    """`_FloorVerdict.count` logs its first count at once and keeps the later ones for `flush`:
    the log and the grid's rejection counts end as if every count had gone in at once."""
    from planner import search as search_module

    reasons = ["memory: a", "memory: b", "memory: a", "memory: c"]
    over = np.array([True, True, False, False])
    full = np.array([False, False, False, True])

    def counted(kept_back: bool) -> tuple[dict, list]:
        log = search_module.RejectionLog()
        grid = search_module._GridRejections.of(reasons)
        for j in range(4):  # the reasons' examples, as the first memory prices log them
            log.add(reasons[j], f"example {j}", 0)
        verdict = search_module._FloorVerdict(over, full, True, int(full.sum()))
        for _ in range(3):
            if kept_back:
                verdict.count(grid, log)
            else:
                grid.add(log, over)
                log.add(search_module.COMBINED_FULL_RECOMPUTE, "pipelined MoE meshes with combined 1F1B", 1)
        verdict.flush(log)
        grid.flush(log)
        return log.counts, log.as_list()

    assert counted(True) == counted(False)
    counts, _ = counted(True)
    assert counts["memory: a"] == 3 and counts["memory: b"] == 3 and counts[search_module.COMBINED_FULL_RECOMPUTE] == 3
