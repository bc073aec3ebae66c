"""Rank strides of every group, with and without MoE parallel folding."""

from cost_models.layout import Layout
from cost_models.mesh import mesh_strides
from model_specs.spec import TrainingSpec

TRAIN = TrainingSpec(seq_len=8192, global_batch=4096)


def strides(gpus: int, **kw: object):
    return mesh_strides(Layout(**kw).resolved(gpus, TRAIN))


def test_folded_expert_grid_strides_over_tp_then_cp() -> None:
    """Megatron-Core 0.10+: expert layers see tp x cp x dp as etp x ep x edp, etp fastest."""
    st = strides(2048, tp=4, cp=2, pp=8, ep=8)  # dp 32
    assert (st.tp, st.cp, st.dp, st.pp) == (1, 4, 8, 256)
    assert st.ep == 4  # etp = tp = 4, then EP over the CP ranks and on into dp
    assert st.expert_dp == 32
    assert strides(2048, tp=4, cp=2, pp=8, ep=8, etp=1).ep == 1


def test_unfolded_expert_grid_is_inside_dp() -> None:
    """Megatron-Core 0.9 (RankGenerator: dp split into ep x dp / ep, ep next to dp): an EP group
    strides over TP x CP, its expert-data-parallel group over TP x CP x EP."""
    st = strides(2048, tp=4, cp=2, pp=8, ep=8, moe_parallel_folding=False)
    assert (st.tp, st.cp, st.dp, st.pp) == (1, 4, 8, 256)
    assert st.ep == 8 and st.expert_dp == 64
    # pp before cp in the order: dp's stride, and so EP's, includes the pipeline ranks
    st = strides(2048, tp=4, cp=2, pp=8, ep=8, order="tp-pp-cp-ep-dp", moe_parallel_folding=False)
    assert st.ep == st.dp == 64
    # dp = ep: the expert-data-parallel group is the CP ranks
    assert strides(64, tp=4, cp=2, ep=8, moe_parallel_folding=False).expert_dp == 4


def test_folding_changes_nothing_without_context_parallelism() -> None:
    """With cp = 1 and etp = tp the two expert grids are the same ranks."""
    for kw in ({"tp": 4, "ep": 8}, {"tp": 2, "pp": 4, "ep": 4}, {"tp": 1, "ep": 8, "pp": 2, "order": "tp-pp-cp-ep-dp"}):
        assert strides(512, **kw) == strides(512, **kw, moe_parallel_folding=False)
