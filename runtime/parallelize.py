"""Turn the reference model into this rank's parallel model parts for a RunSpec.

Order (torchtitan's): build the whole model on the meta device (no storage), cut this pipeline
rank's chunks, then per chunk apply tensor / sequence parallel, expert parallel, context parallel,
activation recompute and finally FSDP2, all on meta; then materialise: `to_empty` gives each
chunk's local shards storage on the rank's device, and only they are filled, from the seed
(`runtime.weights.SeededInit`: each parameter's values come from the seed and its global name,
tile by tile, so every layout starts from the same weights as a single-process run) or from a
HuggingFace checkpoint (`runtime.checkpoint`: each rank reads the slices it owns). A rank's host
memory is its shard, never the model (the whole-model fp32 build on every rank this replaces
needed 4 bytes x the model's parameters per rank before sharding).

Tensor parallel (DTensor `parallelize_module`, Megatron-style):
- attention wq/wk/wv column-parallel, wo row-parallel; MLP w1/w3 column-parallel, w2 row-parallel;
  token embedding row-parallel (vocab-sharded); LM head column-parallel with its logits left
  sharded on the vocabulary (a DTensor), and the cross-entropy computed vocab-parallel under
  `loss_parallel` (Megatron's vocab-parallel loss: each TP rank keeps 1/tp of the logits).
- DTensor saves the all-gathered (full-sequence) input of the column-parallel layers under SP,
  where Megatron saves the sequence shard and re-gathers it in backward.
- Sequence parallel (`sp`): the residual stream between blocks is sharded on the sequence dim;
  norms run `SequenceParallel`; `PrepareModuleInput` all-gathers the sequence before attention and
  the MLP; wo/w2 reduce-scatter back to sequence shards. Learned position tables are row-parallel
  with sequence-sharded output.
- Heads are split over TP: tp must divide the query and KV heads (KV-head replication for
  tp > kv_heads is not implemented). Per-head q/k norm weights are replicated; their gradients
  (partial per TP rank) are all-reduced over TP after backward (`tp_partial_modules`). ALiBi slopes
  are sliced to the local heads.
- Not supported with tp > 1: MLA attention, attention sinks, MoE layers (expert tensor parallel).

FSDP2 (`fully_shard` on the token embedding, each block, the final norm with the LM head (one unit
with the embedding when they are tied: `edge_units`, torchtitan's units), then the chunk root), over
`Meshes.fsdp` (dp_shard x cp, or HSDP (dp_replicate, dp_shard x cp)); ZeRO stages as FSDP2 can
express them:
- ZeRO-3: `reshard_after_forward=True` (parameters re-gathered in backward); gradients
  reduce-scattered every micro-batch. The norm + head unit is never resharded after forward, nor
  is the embedding unit under a pipeline (torchtitan's default policy, `edge_units`).
- ZeRO-2: `reshard_after_forward=False` (unsharded parameters kept from forward to backward, freed
  after backward); gradients reduce-scattered every micro-batch, so they stay sharded.
- ZeRO-1: as ZeRO-2, but gradient reduction only on the last micro-batch (unsharded gradients
  accumulate, as ZeRO-1's full gradient buffer does), then reduce-scatter and a sharded optimizer
  step. Approximation: FSDP2 frees the unsharded parameters after backward and all-gathers them
  at the next forward, where ZeRO-1 keeps them persistently and all-gathers after the step.
- ZeRO-0: `replicate` (FSDP2-based DDP), gradients all-reduced on the last micro-batch. Expert
  weights under EP are still FSDP-sharded over `edp` (approximation).
Under pipeline parallelism the schedule decides when gradients are reduced (last micro-batch),
so ZeRO-2/3 behave like ZeRO-1 there except for the resharding choice.

Mixed precision: parameters stay in fp32 (the master copy); with dtype bf16 FSDP2 casts them
(`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`), or autocast does without FSDP.

LoRA (`training.method` "lora", `runtime.lora`): applied to the whole meta model right after it
is built, before the pipeline cut and every wrapper; the adapters are drawn by global name like
every weight, so every layout starts from the same adapters (and a loaded base keeps them). The frozen base is stored in the compute dtype (no fp32 master:
it is never updated); the adapters stay fp32. FSDP2 / `replicate` shard and gather the whole
module (frozen base included) and reduce only the adapters' gradients (FSDP2 requires a uniform
dtype of the trainable parameters only). QLoRA stores the layers' linear weights as NF4
(`runtime.quantize`), quantized weight by weight as they are filled. Not supported: tp > 1, MLP
targets on MoE models; qlora with data parallelism.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from cost_models.pipeline import interleaving_group
from runtime.context_parallel import apply_context_parallel, cp_positions
from runtime.expert_parallel import apply_expert_parallel, expert_params
from runtime.gloo_comms import use_in_place_collectives
from runtime.lora import apply_lora, init_adapters
from runtime.mesh import Meshes
from runtime.model import MLAttention, MoE, NotSupportedError, Transformer, build_model
from runtime.recompute import apply_recompute
from runtime.spec import RunSpec
from runtime.weights import SeededInit, global_names

__all__ = ["ModelParts", "apply_fsdp", "apply_tp", "build_parts", "check_supported", "materialize_parts"]


@dataclass
class ModelParts:
    """This rank's model chunks (one, or vpp with interleaved or V-shape pipelines, placed as
    `StagePartition.chunk_ranks` says) and their bookkeeping."""

    chunks: list[Transformer]
    chunk_ids: list[int]  # global pipeline chunk index of each chunk
    num_chunks: int  # pp x vpp
    fsdp: bool = False
    staged_bytes: int = 0  # largest local tensor read from a checkpoint, in its dtype (runtime.checkpoint)
    # modules whose replicated weights get partial gradients per TP rank (their parameters are
    # looked up when reducing: FSDP replaces the parameter objects)
    tp_partial_modules: list[nn.Module] = field(default_factory=list)

    @property
    def has_first(self) -> bool:
        return 0 in self.chunk_ids

    @property
    def has_last(self) -> bool:
        return self.num_chunks - 1 in self.chunk_ids

    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.chunks for p in m.parameters()]


def compute_dtype(run: RunSpec, device: torch.device) -> torch.dtype:
    """bf16 for bf16/fp16/fp8 training on GPU, fp32 on CPU or with dtype=fp32."""
    if run.dtype == "fp32" or (run.dtype == "auto" and (device.type == "cpu" or run.training.precision == "fp32")):
        return torch.float32
    return torch.bfloat16


def check_supported(run: RunSpec) -> None:
    """Raise NotSupportedError for what the runtime cannot run (module doc; runtime.lora)."""
    spec, lay = run.model, run.layout
    if lay.tp > 1:
        if spec.attention == "mla":
            raise NotSupportedError("tensor parallel with MLA attention is not implemented")
        if spec.attention_sinks:
            raise NotSupportedError("tensor parallel with attention sinks is not implemented")
        if spec.qk_norm and spec.qk_norm_scope == "projection":
            raise NotSupportedError("tensor parallel with q/k norms over the whole projection (OLMo-2) is not implemented")
        if spec.norm_placement != "pre":
            raise NotSupportedError(f"tensor parallel with {spec.norm_placement}-norm blocks is not implemented")
        if spec.is_moe:
            raise NotSupportedError("tensor parallel with MoE layers (expert TP) is not implemented")
        if spec.num_heads % lay.tp or spec.kv_heads % lay.tp:
            raise NotSupportedError(
                f"tp={lay.tp} must divide the {spec.num_heads} query and {spec.kv_heads} KV heads "
                "(KV-head replication is not implemented)"
            )
    if lay.tp > 1 and run.training.frozen_base:
        raise NotSupportedError(
            f"tensor parallel (tp={lay.tp}) with {run.training.method} adapters is not implemented "
            "(the adapters' A and B would need their own column / row plans)"
        )
    if run.training.method == "qlora" and lay.dp_ * lay.cp > 1:
        raise NotSupportedError(
            f"qlora with data parallelism (dp x cp = {lay.dp_ * lay.cp}) is not implemented: FSDP2 shards torchao's NF4 "
            "weights, but their to_empty leaves NF4's lookup table on the meta device (torchao 0.18); run it on one "
            "rank per pipeline stage, or as method lora"
        )
    if lay.pp > 1 and spec.tie_embeddings:
        raise NotSupportedError("tied embeddings across pipeline stages are not implemented")
    if lay.fsdp_root_holds_ends:
        raise NotSupportedError(
            "fsdp_root_holds_ends (both ends in FSDP's root group, torchtitan before pytorch/torchtitan#1094) prices "
            "an older stack's memory: the runtime wraps the embedding and the norm + head as units of their own"
        )
    if spec.is_moe and lay.ep > 1 and lay.etp_ != 1:
        raise NotSupportedError("expert tensor parallel (etp > 1) is not implemented")
    if spec.is_moe and lay.ep > 1 and lay.cp > 1 and not lay.moe_parallel_folding:
        raise NotSupportedError(
            "an expert grid without MoE parallel folding (EP inside DP only) with context parallelism is not "
            "implemented: the runtime carves EP out of dp x cp (runtime.mesh)"
        )
    if lay.pp > 1 and lay.schedule_ == "interleaved_1f1b" and interleaving_group("fsdp", lay.pp, lay.grad_accum_) is None:
        raise NotSupportedError(
            f"torch's ScheduleInterleaved1F1B runs the {lay.grad_accum_} micro-batches in m // pp rounds, which must "
            f"divide them (pp={lay.pp}); Megatron-Core's micro-batch groups are not torch's"
        )


# ---- pipeline chunks ----------------------------------------------------------------------------


def _cut_chunk(model: Transformer, layers: range, first: bool, last: bool) -> Transformer:
    keep = {str(i) for i in layers}
    for key in list(model.layers.keys()):
        if key not in keep:
            del model.layers[key]
    if not first:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


def _install_positions(model: Transformer, positions: torch.Tensor) -> None:
    """Every forward of `model` gets `positions` (the full sequence, or this CP rank's chunks):
    pipeline stages and sequence-sharded inputs cannot infer them from their input's shape."""

    def hook(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = dict(kwargs)
        kwargs.setdefault("positions", positions)
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)


# ---- tensor parallel ----------------------------------------------------------------------------


def apply_tp(model: Transformer, tp_mesh, sp: bool) -> list[nn.Module]:
    """Tensor (+ sequence) parallel plan of the module doc. Returns the modules whose replicated
    weights get gradients that are partial sums over TP ranks (to all-reduce after backward)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    seq = Shard(1)
    plan: dict[str, object] = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq if sp else Replicate())
    if model.pos_embeddings is not None:
        plan["pos_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(0) if sp else Replicate()
        )
    if model.norm is not None and sp:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        # Logits stay sharded on the vocabulary (a DTensor); the loss runs under `loss_parallel`.
        plan["output"] = ColwiseParallel(
            input_layouts=seq if sp else Replicate(), output_layouts=Shard(-1), use_local_output=False
        )
    parallelize_module(model, tp_mesh, plan)  # type: ignore[arg-type]
    if model.spec.tie_embeddings and model.output is not None and model.tok_embeddings is not None:
        model.output.weight = model.tok_embeddings.weight

    partial: list[nn.Module] = []
    for block in model.layers.values():
        attn, mlp = block.attention, block.mlp
        if isinstance(attn, MLAttention) or isinstance(mlp, MoE):
            raise NotSupportedError("tensor parallel supports standard attention and dense MLPs only")
        bplan: dict[str, object] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq if sp else Replicate()),
            "mlp.w1": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(output_layouts=seq if sp else Replicate()),
        }
        if mlp.w3 is not None:
            bplan["mlp.w3"] = ColwiseParallel()
        if sp:
            bplan["attention_norm"] = SequenceParallel()
            bplan["ffn_norm"] = SequenceParallel()
            bplan["attention"] = PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None))
            bplan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        parallelize_module(block, tp_mesh, bplan)  # type: ignore[arg-type]
        attn.n_heads //= tp
        attn.n_kv_heads //= tp
        if attn.alibi_slopes is not None:
            h = attn.alibi_slopes.shape[0] // tp
            attn.alibi_slopes = attn.alibi_slopes[rank * h : (rank + 1) * h].clone()
            attn.head_start = rank * h  # the slopes are refilled for these heads after `to_empty`
        for norm in (attn.q_norm, attn.k_norm):
            if norm is not None:
                partial.append(norm)
    return partial


def tp_reduce_partial_grads(modules: list[nn.Module], tp_mesh) -> None:
    """All-reduce (sum) over TP the gradients of replicated weights used on local heads only
    (after FSDP's reduction, which is linear, so the order does not matter)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    group = tp_mesh.get_group()
    for p in (p for m in modules for p in m.parameters()):
        if p.grad is not None:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(g, group=group)


# ---- FSDP -------------------------------------------------------------------------------------------


def _expert_shard_placement(emesh):
    """FSDP2 shards dim 0 by default; an EP rank holds only E/ep experts on dim 0 (one for Mixtral
    at ep=8), and FSDP pads a dim 0 shorter than the `edp` group to one row per rank, so every rank
    kept a whole expert (measured: Mixtral-8x7B EP8 over 64 ranks, 2 layers, 4.0 GiB of parameters
    and optimizer state between steps instead of 0.74). Shard dim 1 (expert width / hidden) when
    the local experts do not divide evenly over `edp`, as torchtitan does."""
    from torch.distributed.tensor import DTensor, Shard

    if emesh is None or emesh.size() == 1:
        return None
    n = emesh.size()

    def place(p):
        local = p.to_local() if isinstance(p, DTensor) else p
        if local.shape[0] % n == 0 or local.dim() < 2:
            return Shard(0)
        return Shard(1)

    return place


def apply_fsdp(model: Transformer, meshes: Meshes, zero_stage: int, mp_dtype: torch.dtype | None, pp: bool) -> None:
    """FSDP2 per block then the chunk root, per the ZeRO stage (module doc)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32) if mp_dtype else MixedPrecisionPolicy()
    lay = meshes.layout
    reshard = zero_stage >= 3
    experts = set(expert_params(model)) if lay.ep > 1 else set()
    if experts:
        emesh = meshes.expert_fsdp
        for block in model.layers.values():
            inner = getattr(block, "_checkpoint_wrapped_module", block)
            if isinstance(inner.mlp, MoE):
                fully_shard(
                    inner.mlp.experts, mesh=emesh, reshard_after_forward=reshard, mp_policy=mp,
                    shard_placement_fn=_expert_shard_placement(emesh),
                )
                use_in_place_collectives(inner.mlp.experts, emesh)
                inner.mlp.experts.set_gradient_divide_factor(float(lay.dp_ * lay.cp))  # type: ignore[operator]
                if emesh is not None and emesh.device_type == "cpu" and emesh.size() > 1:
                    # gloo has no PREMUL_SUM: sum, then divide locally. (Not on one rank, where
                    # FSDP would divide twice.)
                    inner.mlp.experts.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    if zero_stage == 0:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        rmesh = meshes["dp_cp"]
        for block in model.layers.values():
            replicate(block, mesh=rmesh, mp_policy=mp)
        replicate(model, mesh=rmesh, mp_policy=mp)
        return
    mesh = meshes.fsdp
    # on gloo, each unit reduces and gathers without gloo's copies (runtime.gloo_comms: gloo's
    # worker thread frees them, and the buffers it works on, whenever it next gets the GIL)
    for modules, reshard_unit in edge_units(model, reshard, pp):
        use_in_place_collectives(fully_shard(modules, mesh=mesh, reshard_after_forward=reshard_unit, mp_policy=mp), mesh)
    for block in model.layers.values():
        use_in_place_collectives(fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp), mesh)
    # the root holds no parameter of its own any more (every one is in a unit above): it only
    # runs FSDP2's root hooks (lazy init, the final reduce-scatter wait)
    use_in_place_collectives(fully_shard(model, mesh=mesh, reshard_after_forward=reshard and not pp, mp_policy=mp), mesh)


def edge_units(model: Transformer, reshard: bool, pp: bool) -> list[tuple[list[nn.Module], bool]]:
    """The FSDP2 units of a chunk's embedding and output ends, with their `reshard_after_forward`,
    as torchtitan wraps them (its `apply_fsdp`, torchtitan/models/llama3/infra/parallelize.py at
    v0.2.2, 73a0e69; the tied case from torchtitan/distributed/fsdp.py `apply_fsdp_to_decoder` at
    b5bcd76), so that only one unit's unsharded parameters and gradients live at a time instead
    of the whole vocabulary table and LM head in the root for the whole forward and backward:

    - the token embedding (with the learned position table, when there is one) is a unit resharded
      after forward as the blocks are under torchtitan's default policy (ZeRO-3 without a
      pipeline; the plan's torchtitan export writes ZeRO-3 as "default"): gathered for the first
      forward, freed, gathered again for its backward;
    - the final norm and the output head are one unit never resharded after forward (torchtitan:
      FSDP would prefetch them straight back for the backward, which starts there): gathered from
      the end of the forward to the end of their backward, then freed;
    - tied embeddings (one table used at both ends): the embedding, the final norm and the head
      are one unit, not resharded after forward (torchtitan's tied case: two units would gather
      the shared table twice).

    A chunk of a pipeline holds only the ends it has (none for a middle stage)."""
    emb = [m for m in (model.tok_embeddings, model.pos_embeddings) if m is not None]
    head = [m for m in (model.norm, model.output) if m is not None]
    if model.spec.tie_embeddings and model.tok_embeddings is not None and model.output is not None:
        return [(emb + head, False)]
    units: list[tuple[list[nn.Module], bool]] = []
    if emb:
        units.append((emb, reshard and not pp))
    if model.output is not None:
        units.append((head, False))
    return units


# ---- all together -----------------------------------------------------------------------------------


def build_parts(
    run: RunSpec,
    meshes: Meshes,
    device: torch.device,
    fake_mode: contextlib.AbstractContextManager | None = None,
    *,
    materialize: bool = True,
    timings: dict[str, float] | None = None,
) -> ModelParts:
    """This rank's parallel model chunks for `run` (see module doc).

    `fake_mode` (a FakeTensorMode, for memory tracing): the shards are materialised inside it
    (fake storage, no values). `materialize=False` leaves every parameter on the meta device
    (shapes and placements only: what a rank would hold, at no cost). `run.hf_checkpoint`: the
    base weights come from that HuggingFace checkpoint (`runtime.checkpoint`) instead of the seed.
    `timings` (when given) receives the seconds of each phase: build (meta model, cut, wrappers),
    materialise (`to_empty`), init (seeded values) and load (checkpoint reads)."""
    check_supported(run)
    clock = time.perf_counter()
    lay = run.layout
    part = run.stage_partition
    n_chunks = lay.pp * lay.vpp
    # The partition places the chunks: chunk c on rank c % pp (looped), or as a V (zbv, dualpipev:
    # rank c, then 2pp - 1 - c, so rank 0 holds the embedding and the LM head).
    mine = [c for c, r in enumerate(part.chunk_ranks) if r == meshes.pp_rank]
    ranges = part.chunk_ranges()
    source = None
    if run.hf_checkpoint is not None:
        from runtime.checkpoint import HFCheckpoint

        source = HFCheckpoint.open(run.hf_checkpoint, run.model)
    numerics = source.numerics if source is not None else {}
    # The whole model on the meta device (no storage). LoRA freezes the base (stored in the
    # compute dtype) and adds the adapters before any cut or wrapper.
    full = build_model(run.model, device="meta", dtype=torch.float32, **numerics)
    apply_lora(full, run.training, base_dtype=compute_dtype(run, device))
    chunks: list[Transformer] = []
    for i, c in enumerate(mine):
        # a deep copy of a meta model copies no storage; the last chunk takes the model itself
        m = full if i == len(mine) - 1 else copy.deepcopy(full)
        chunks.append(_cut_chunk(m, ranges[c], first=c == 0, last=c == n_chunks - 1) if lay.pp > 1 else m)
    del full

    rank_layers = part.rank_layers(meshes.pp_rank)
    if lay.recompute == "full" and lay.recompute_layers is not None:
        recomputed = rank_layers[: lay.recompute_layers]
    else:
        recomputed = rank_layers
    positions = cp_positions(run.training.seq_len, lay.cp, meshes.cp_rank, device)
    parts = ModelParts(chunks, mine, n_chunks)
    tp_mesh = meshes.get("tp")
    cp_mesh = meshes.get("cp")
    ep_mesh = meshes.get("ep") if run.model.is_moe else None
    use_fsdp = meshes.fsdp is not None
    mp_dtype = compute_dtype(run, device) if compute_dtype(run, device) != torch.float32 else None
    for m in chunks:
        _install_positions(m, positions)
        if tp_mesh is not None:
            parts.tp_partial_modules += apply_tp(m, tp_mesh, lay.sp_)
        if ep_mesh is not None:
            apply_expert_parallel(m, ep_mesh)
        if cp_mesh is not None:
            apply_context_parallel(m, cp_mesh, run.training.seq_len, device)
        apply_recompute(m, lay.recompute, recomputed if lay.recompute == "full" else None)
        if use_fsdp:
            apply_fsdp(m, meshes, lay.zero_stage, mp_dtype, pp=lay.pp > 1)
    parts.fsdp = use_fsdp
    _tick(timings, "build_s", clock)
    if materialize:
        materialize_parts(parts, run, device, fake_mode, source, timings)
    return parts


def _tick(timings: dict[str, float] | None, key: str, since: float) -> float:
    now = time.perf_counter()
    if timings is not None:
        timings[key] = timings.get(key, 0.0) + now - since
    return now


def materialize_parts(
    parts: ModelParts,
    run: RunSpec,
    device: torch.device,
    fake_mode: contextlib.AbstractContextManager | None = None,
    source=None,  # type: ignore[no-untyped-def]  # runtime.checkpoint.HFCheckpoint | None
    timings: dict[str, float] | None = None,
) -> None:
    """Give the meta chunks' local shards storage on `device` (`to_empty`; inside `fake_mode`
    when given: fake storage, nothing filled) and fill them: the seeded values of
    `runtime.weights` for every parameter and buffer, then the checkpoint's base weights when
    `source` is given (the adapters keep their seeded values: a LoRA run starts at the base)."""
    clock = time.perf_counter()
    with fake_mode or contextlib.nullcontext():
        for m in parts.chunks:
            m.to_empty(device=device)
            _retie(m)
    clock = _tick(timings, "materialize_s", clock)
    if fake_mode is not None:
        return
    init = SeededInit(run.seed, global_names(parts.chunks))
    with torch.no_grad():
        for m in parts.chunks:
            if source is None:
                m.init_weights(init)
            else:  # every weight comes from the checkpoint (which refuses a missing one)
                _init_buffers(m)
            init_adapters(m, init)  # LoRA adapters: seeded, on a loaded base too
    clock = _tick(timings, "init_s", clock)
    if source is not None:
        parts.staged_bytes = source.load(parts.chunks)
        _tick(timings, "load_s", clock)


def _retie(model: Transformer) -> None:
    """Tied embeddings stay one parameter after `to_empty` (which converts each module's
    parameters in turn)."""
    if model.spec.tie_embeddings and model.output is not None and model.tok_embeddings is not None:
        model.output.weight = model.tok_embeddings.weight


def _init_buffers(model: Transformer) -> None:
    """The buffers a checkpoint does not hold (ALiBi slopes), for a model whose weights it loads."""
    from runtime.model import _init_alibi

    for layer in model.layers.values():
        block = getattr(layer, "_checkpoint_wrapped_module", layer)
        attn = getattr(block, "attention", None) or getattr(block, "mixer", None)
        if attn is not None and getattr(attn, "alibi_slopes", None) is not None:
            _init_alibi(attn)
