"""Knob-independent communication of a mesh, priced once per job and shared.

What one micro-batch of a mesh sends (tensor / sequence parallel collectives, a context-parallel
ring step, the MoE all-to-alls, a pipeline boundary), which channel each group occupies, and the
token-embedding gradients' kernels, memoized per job (`comm_store`) on the degrees, micro-batch and
rank stride each part depends on. The stage tables (`cost_models.stage_table.build_table`) and the
planner's bounds read the same figures from here.
"""

from __future__ import annotations

from typing import Any

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration
from cost_models.comm import INTRA, Group, collective_time, dedup_dispatch_time, remote_domains_per_token
from cost_models.compute import ShardGeometry, embedding_gradient_time, routed_rows, trained_mtp_layers
from cost_models.interning import KeptMemo
from cost_models.mesh import MeshLike, mesh_strides
from model_specs.spec import ModelSpec, TrainingSpec

_COMM_STORES: KeptMemo[dict[tuple, Any]] = KeptMemo(64)


def comm_store(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, cal: Calibration, gpus: int) -> dict[tuple, Any]:
    """Memo of `mesh_comm` parts (seconds) for one job, keyed per part on the degrees, micro-batch
    and rank stride it depends on; also of `build_table`'s LM head and MTP projection times, the
    weights outside its layers (`stage_table._outside_layers`) and its placed communication
    (`stage_table._placed_comm`), each under a key that names it first. Job objects are matched by
    identity (`KeptMemo`)."""
    key = (id(model), id(training), id(cluster), id(cal), gpus)
    store = _COMM_STORES.get(key)
    if store is None:
        store = _COMM_STORES.put(key, (model, training, cluster, cal), {})
    return store


def mesh_comm(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    mesh: MeshLike,
    cal: Calibration,
    micro_batches: tuple[int, ...] | None = None,
    store: dict[tuple, Any] | None = None,
    sizes: bool = True,
) -> list[tuple[float, float, float, float, float, float]]:
    """Knob-independent communication of one micro-batch, at each of `micro_batches` (sequences;
    None: the mesh's own micro-batch only), seconds:
      tp    one layer's forward TP/SP collectives (attention block and MLP; a hybrid layer's mixer);
      cp    one ring step of context parallelism: this rank's K/V block sent to the next rank
            (forward; the backward sends K, V and dK, dV: twice the bytes); under all-gather
            attention (`cp_attention = allgather_mask`), one layer's K/V all-gather;
      ep    one MoE layer's forward all-to-alls (dispatch + combine; the backward has as many),
            and under expert TP with SP the expert-TP all-gather of the routed rows after dispatch
            and their reduce-scatter before combine (Megatron-Core's alltoall dispatcher);
      etp   the expert-TP part of `ep` (it runs on the expert-TP group's channel);
      p2p   one pipeline boundary send;
    and the boundary's bytes. Each is affine in the micro-batch (bytes x seconds per byte +
    latency). `mesh` needs tp, cp, pp, ep, etp_, dp_, sp_, micro_batch, order. Each part depends on a
    few degrees, the micro-batch and one rank stride: it is memoized on them, in the job's
    `comm_store` (`store`: pass it when pricing many meshes of one job). `sizes` False: every
    collective at its alpha-beta time, without the atlas's measured size ratio
    (`comm.collective_time`): a lower bound, exactly affine in the micro-batch (the planner's
    bounds; kept in a store of its own)."""
    if micro_batches is None:
        micro_batches = (mesh.micro_batch,)
    tp, cp, ep = mesh.tp, mesh.cp, mesh.ep
    ab = training.activation_bytes
    st = mesh_strides(mesh)
    h = model.hidden_size
    sp = mesh.sp_
    if store is None:
        store = comm_store(model, training, cluster, cal, gpus)
    if not sizes:
        store = store.setdefault(("alpha_beta",), {})  # type: ignore[assignment]
    expert_parallel = ep > 1 and model.is_moe
    allgather_cp = getattr(mesh, "cp_attention", "ring") == "allgather_mask"
    out = []
    key: tuple
    for mb in micro_batches:
        tokens = mb * training.seq_len / cp
        act_full = tokens * h * ab
        boundary = act_full / (tp if sp else 1)
        tp_per_layer = cp_step = ep_per_moe = etp_per_moe = p2p = 0.0
        if tp > 1:
            key = ("tp", tp, cp, sp, mb, st.tp)
            tp_per_layer = store.get(key)  # type: ignore[assignment]
            if tp_per_layer is None:
                tp_per_layer = store[key] = _tp_comm(
                    cluster, gpus, cal, tp, sp, act_full, st.tp, model.tp_blocks_per_layer, sizes
                )
        if cp > 1:
            key = ("cp", tp, cp, mb, st.cp, allgather_cp)
            cp_step = store.get(key)  # type: ignore[assignment]
            if cp_step is None:
                kv_heads = model.num_heads / tp if model.attention == "mla" else max(model.kv_heads / tp, 1.0)
                block = mb * training.seq_len / cp * kv_heads * (model.qk_head_dim + model.v_dim) * ab
                group = Group.strided(cluster, cp, st.cp, gpus)
                if allgather_cp:
                    cp_step = collective_time("all_gather", block * cp, group, cal, sizes)
                else:
                    cp_step = collective_time("p2p", block, group, cal)
                store[key] = cp_step
        if expert_parallel:
            dispatcher = getattr(mesh, "moe_token_dispatcher", "alltoall")
            key = ("ep", tp, cp, sp, ep, mesh.etp_, mb, st.ep, dispatcher)
            ep_per_moe = store.get(key)  # type: ignore[assignment]
            if ep_per_moe is None:
                copy_bytes = tokens / (tp if sp else 1) * h * ab  # one copy of the tokens this rank routes
                group = Group.strided(cluster, ep, st.ep, gpus)
                if dispatcher == "flex":
                    remote = remote_domains_per_token(
                        model.num_experts, model.moe_top_k, group.link.domains,
                        model.moe_router_groups, model.moe_router_group_topk,
                    )
                    a2a = dedup_dispatch_time(copy_bytes, model.moe_top_k, remote, group, cal)
                else:
                    a2a = collective_time("all_to_all", model.moe_top_k * copy_bytes, group, cal)
                ep_per_moe = store[key] = 2 * a2a  # dispatch + combine
        if model.is_moe and sp and mesh.etp_ > 1:
            key = ("etp", tp, cp, mesh.etp_, mb)
            etp_per_moe = store.get(key)  # type: ignore[assignment]
            if etp_per_moe is None:
                # expert-TP exchange of the routed rows: all-gather after dispatch, reduce-scatter
                # before combine; stride 1 (expert-TP is innermost)
                rows = routed_rows(model, ShardGeometry.of(mesh, mb, training.seq_len)) * h * ab
                etp_group = Group.strided(cluster, mesh.etp_, 1, gpus)
                etp_per_moe = store[key] = collective_time("all_gather", rows, etp_group, cal, sizes) + collective_time(
                    "reduce_scatter", rows, etp_group, cal, sizes
                )
        if mesh.pp > 1:
            key = ("p2p", tp, cp, sp, mb, st.pp)
            p2p = store.get(key)  # type: ignore[assignment]
            if p2p is None:
                p2p = store[key] = collective_time("p2p", boundary, Group.strided(cluster, 2, st.pp, gpus), cal)
        out.append((tp_per_layer, cp_step, ep_per_moe + etp_per_moe, p2p, boundary, etp_per_moe))
    return out


def mesh_channels(cluster: ClusterSpec, gpus: int, mesh: MeshLike) -> tuple[int, int, int, int, int]:
    """The channel (`comm.INTRA` or `comm.INTER`) of the TP, CP, EP, pipeline and expert-TP groups
    of `mesh`: which link their traffic occupies (`cost_models.comm`)."""
    st = mesh_strides(mesh)
    return (
        Group.strided(cluster, mesh.tp, st.tp, gpus).channel,
        Group.strided(cluster, mesh.cp, st.cp, gpus).channel,
        Group.strided(cluster, mesh.ep, st.ep, gpus).channel,
        Group.strided(cluster, 2, st.pp, gpus).channel if mesh.pp > 1 else INTRA,
        Group.strided(cluster, mesh.etp_, 1, gpus).channel,
    )


def _tp_comm(
    cluster: ClusterSpec, gpus: int, cal: Calibration, tp: int, sp: bool, act_full: float, stride: int, blocks: int = 2,
    sizes: bool = True,
) -> float:
    """Seconds of one layer's forward TP/SP collectives over `act_full` bytes of activations: one
    all-reduce (or all-gather + reduce-scatter under SP) per TP block of the layer
    (`ModelSpec.tp_blocks_per_layer`: attention and MLP, or a hybrid layer's one mixer)."""
    tpg = Group.strided(cluster, tp, stride, gpus)
    if sp:
        one = collective_time("all_gather", act_full, tpg, cal, sizes) + collective_time(
            "reduce_scatter", act_full, tpg, cal, sizes)
    else:
        one = collective_time("all_reduce", act_full, tpg, cal, sizes)
    return blocks * one


def embedding_gradient_times(
    model: ModelSpec, tp: int, cluster: ClusterSpec, framework: str, training: TrainingSpec, cal: Calibration,
    store: dict[tuple, Any],
) -> tuple[float, float, float]:
    """Seconds per micro-batch of the token-embedding tables' dense gradients
    (`compute.embedding_gradient_time` of one vocab / tp shard), memoized in the job's `comm_store`:
    the first rank's table with the LM head on another rank, the same with the head there too, and
    on the head's rank away from the first, the MTP modules' copy of the table (one lookup per
    module; an untied copy, so the first price; none for tied tables, whose head is the copy). All
    0 on a frozen base. `build_table` and the search's bounds read the same three."""
    key = ("embedding_grads", tp, framework)
    out = store.get(key)
    if out is None:
        out = (0.0, 0.0, 0.0)
        if not training.frozen_base or training.trainable_embeddings:
            elsewhere, with_head = (
                embedding_gradient_time(
                    model, tp, cluster.gpu, framework, training.param_bytes, training.grad_bytes, same, cal
                )
                for same in (False, True)
            )
            mtp = trained_mtp_layers(model, False)
            out = (elsewhere, with_head, 0.0 if model.tie_embeddings else mtp * elsewhere)
        store[key] = out
    return out
