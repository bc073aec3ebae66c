"""The search space: every hybrid layout of a job, generated level by level.

Level 1, the *mesh*: every factorization of the GPU count into dp x tp x pp x cp, expert
parallelism carved out of dp x cp (x tp with expert-TP 1), and the rank order that decides which
dimension stays inside the NVLink domain. Level 2, the *knobs* that do not change the mesh: micro-
batch (and so gradient accumulation for the fixed global batch), ZeRO stage and hybrid-sharding
group, recompute, virtual stages and schedule, optimizer offload.

Everything is enumerated; what is invalid is rejected by `cost_models.layout.validate_layout` (the
same rules as `autopar evaluate`), counted by reason.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from cluster_specs.spec import ClusterSpec
from cost_models.layout import AttentionKernel, Layout, default_attention_kernel, ep_next_to_dp
from cost_models.pipeline import dualpipev_micro_batches_ok, interleaving_group, zero_bubble_rounds_ok
from cost_models.stage_data import Setting
from cost_models.zero3_gathers import deepspeed_has
from model_specs.spec import ModelSpec, TrainingSpec
from planner.plan import SearchConstraints

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-cp-ep-dp")
"""Rank orders searched: Megatron's default (PP outermost: pipeline stages on different nodes,
data-parallel groups next), PP inside DP (pipeline neighbours closer, gradient all-reduce across
pipelines), and PP just outside TP (a pipeline inside one NVLink domain when tp x pp fits)."""


MAX_MICRO_BATCH = 128
"""Largest micro-batch (sequences) searched: llm-foundry's published runs use up to 128 for
125M-760M models (short sequences); larger ones only grow memory once the GEMMs saturate."""


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    out = [1]
    for p, e in factorize(n).items():
        out = [d * p**k for d in out for k in range(e + 1)]
    return tuple(sorted(out))


def divisors(n: int) -> list[int]:
    """Every divisor of n >= 1, ascending, from its prime factorization (`factorize`): the work
    grows with the number of divisors, not with n (trial division up to sqrt(n) would take
    2**28 steps for n = 2**56)."""
    if n < 1:
        raise ValueError(f"divisors of {n}: need n >= 1")
    return list(_divisors(n))


_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (the first 12 primes as witnesses)."""
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _SMALL_PRIMES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _pollard_rho(n: int) -> int:
    """A non-trivial factor of a composite odd n (Pollard's rho, Brent's cycle detection; the
    constant steps 1, 2, ... make it deterministic)."""
    for c in itertools.count(1):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise AssertionError("unreachable")


def factorize(n: int) -> dict[int, int]:
    """Prime factorization {prime: exponent} of n >= 1: small primes by division, the rest by
    Miller-Rabin and Pollard's rho."""
    out: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            out[m] = out.get(m, 0) + 1
            continue
        f = _pollard_rho(m)
        stack += [f, m // f]
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Mesh:
    """Level 1: the parallel degrees and rank order."""

    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    etp: int
    order: str
    micro_batch: int = 1  # set per (mesh, micro-batch) pair when pricing communication
    moe_parallel_folding: bool = True  # Layout.moe_parallel_folding
    sequence_parallel: bool = True  # SearchConstraints.sequence_parallel: SP beside TP > 1

    def at_micro_batch(self, micro_batch: int) -> Mesh:
        """This mesh priced at `micro_batch` sequences (`dataclasses.replace`, without its cost)."""
        return Mesh(
            self.tp, self.pp, self.cp, self.dp, self.ep, self.etp, self.order, micro_batch, self.moe_parallel_folding,
            self.sequence_parallel,
        )

    # duck-typed like a resolved Layout for cost_models.mesh / mesh_comm.mesh_comm
    @property
    def dp_(self) -> int:
        return self.dp

    @property
    def etp_(self) -> int:
        return self.etp

    @property
    def sp_(self) -> bool:
        return self.tp > 1 and self.sequence_parallel


def _pinned(value: int | None, options: list[int]) -> list[int]:
    return [value] if value is not None else options


def meshes(model: ModelSpec, cluster: ClusterSpec, gpus: int, c: SearchConstraints) -> Iterator[Mesh]:
    """Every (tp, pp, cp, dp, ep, etp, order) whose degrees multiply to `gpus`, on the expert grid of
    the user's stack (`SearchConstraints.moe_parallel_folding`)."""
    divs = divisors(gpus)
    folded = c.moe_parallel_folding
    for tp in _pinned(c.tp, divs):
        for pp in _pinned(c.pp, [d for d in divs if (gpus // tp) % d == 0]):
            rest = gpus // (tp * pp) if gpus % (tp * pp) == 0 else 0
            if not rest:
                continue
            cps = [1] if c.framework == "deepspeed" else divisors(rest)  # no CP in DeepSpeed
            for cp in _pinned(c.cp, cps):
                if rest % cp:
                    continue
                dp = rest // cp
                if c.dp is not None and dp != c.dp:
                    continue
                if model.is_moe and folded:
                    ep_options = [e for e in divisors(model.num_experts) if (dp * cp * tp) % e == 0]
                    etps = sorted({tp, 1})
                elif model.is_moe:  # Megatron-Core 0.9: EP inside DP, expert TP = TP (layout._unfolded_expert_violations)
                    ep_options, etps = [e for e in divisors(model.num_experts) if dp % e == 0], [tp]
                else:
                    ep_options, etps = [1], [tp]
                orders = ORDERS if pp > 1 else ORDERS[:1]
                for ep in _pinned(c.ep, ep_options):
                    for etp in etps:
                        for order in orders:
                            if not folded and ep > 1 and not ep_next_to_dp(order):
                                continue
                            yield Mesh(tp, pp, cp, dp, ep, etp, order, moe_parallel_folding=folded,
                                       sequence_parallel=c.sequence_parallel)


def micro_batches(training: TrainingSpec, dp: int, c: SearchConstraints) -> list[int]:
    """Micro-batch sizes that divide the per-replica batch (global batch / dp)."""
    if training.global_batch % dp:
        return []
    per_replica = training.global_batch // dp
    options = [d for d in divisors(per_replica) if d <= MAX_MICRO_BATCH]
    return _pinned(c.micro_batch, options)


def shard_groups(mesh: Mesh, cluster: ClusterSpec, framework: str = "megatron") -> list[int]:
    """ZeRO sharding groups: the whole dp group, and hybrid groups that keep the shard inside one
    NVLink domain (and inside one node), the layouts HSDP and Megatron's distributed-optimizer
    instances use. DeepSpeed shards over the whole dp group only (its in-node groups are hpZ's,
    `hpz_groups`)."""
    if framework == "deepspeed":
        return [mesh.dp]
    groups = {mesh.dp}
    for span in {cluster.gpus_per_node, cluster.domain_size}:
        per = span // (mesh.tp * mesh.cp)
        if per >= 1 and mesh.dp % per == 0 and per < mesh.dp and span % (mesh.tp * mesh.cp) == 0:
            groups.add(per)
    return sorted(groups)


def hpz_groups(mesh: Mesh, cluster: ClusterSpec, framework: str) -> list[int]:
    """ZeRO++ hpZ secondary groups searched under DeepSpeed ZeRO-3: off, and one node's data-parallel
    ranks when the dp group spans nodes (the seeds' recipe: `zero_hpz_partition_size` = ranks per
    node, DeepSpeed's ZeRO++ tutorial)."""
    if framework != "deepspeed":
        return [1]
    per_node = cluster.gpus_per_node // (mesh.tp * mesh.cp)
    if per_node > 1 and mesh.dp % per_node == 0 and per_node < mesh.dp:
        return [1, per_node]
    return [1]


class PipeOption(NamedTuple):
    """How one mesh pipelines: virtual stages, schedule, Megatron-Core's uneven-split slots
    (`Layout.account_for_embedding_in_pipeline_split` / `account_for_loss_in_pipeline_split`), and
    Megatron-Core's combined 1F1B (`Layout.moe_a2a_overlap`)."""

    vpp: int
    schedule: str
    embedding_slot: bool = False
    loss_slot: bool = False
    a2a_overlap: bool = False


def pipeline_options(model: ModelSpec, training: TrainingSpec, mesh: Mesh, mb: int, c: SearchConstraints) -> list[PipeOption]:
    """1F1B and GPipe without virtual stages; interleaved 1F1B for every vpp >= 2 whose pp x vpp
    chunks split the layers, when the framework runs this many micro-batches interleaved
    (`pipeline.interleaving_group`); for framework fsdp, the
    zero-bubble schedule (ZB1P) on one chunk per rank and on every even interleaving, and the V-shape
    schedules (ZB-V; DualPipeV when there are at least 2 x pp micro-batches) where every rank keeps
    two chunks of at least one layer; looped BFS (interleaving's bubble, GPipe's memory) only when
    the constraints pin it. Where the layers do not
    divide, Megatron-Core's slots make them: the loss takes one slot (it is the heavier end: LM
    head and cross-entropy), or the embedding and the loss one each (126 + 2 = 128 = 8 x 8 x 2 for
    Llama-3.1-405B). A vpp is offered while every chunk keeps at least one layer."""
    if mesh.pp == 1 or c.framework == "deepspeed":
        out = [PipeOption(1, "1f1b")]
    else:
        m = training.global_batch // (mb * mesh.dp)
        out = [PipeOption(1, "1f1b"), PipeOption(1, "gpipe")]
        interleaved = interleaved_options(model.num_layers, mesh.pp)
        if interleaving_group(c.framework, mesh.pp, m) is not None:
            out += interleaved
        if c.framework == "fsdp" and zero_bubble_rounds_ok(mesh.pp, m):
            # torch's ZB1P, on one chunk per rank or interleaved over the chunks that split evenly
            out += [PipeOption(1, "zero_bubble")]
            out += [PipeOption(o.vpp, "zero_bubble") for o in interleaved if not (o.embedding_slot or o.loss_slot)]
        if c.framework == "fsdp" and model.num_layers >= 2 * mesh.pp:
            out += [PipeOption(2, "zbv")] + ([PipeOption(2, "dualpipev")] if dualpipev_micro_batches_ok(mesh.pp, m) else [])
        if c.framework == "fsdp" and c.schedule == "looped_bfs":  # dominated by interleaving: only when pinned
            out += [PipeOption(1, "looped_bfs")]
            out += [PipeOption(o.vpp, "looped_bfs") for o in interleaved if not (o.embedding_slot or o.loss_slot)]
    if c.allow_moe_a2a_overlap:
        out += combined_1f1b_options(
            model, mesh, training.global_batch // (mb * mesh.dp), c.framework, out, 0 if training.frozen_base else model.mtp_layers
        )
    if c.schedule:
        out = [o for o in out if o.schedule == c.schedule]
    return out


def combined_1f1b_options(
    model: ModelSpec, mesh: Mesh, micro_batches: int, framework: str, options: list[PipeOption], mtp_layers: int = 0
) -> list[PipeOption]:
    """Megatron-Core's combined 1F1B (`--overlap-moe-expert-parallel-comm`: one micro-batch's
    all-to-alls beside another's compute) of the options that may run it, by Megatron-Core's
    rules (`layout.framework_violations`, `layout.mtp_violations`): an MoE model with ep > 1, at
    least two micro-batches, with pp > 1 only on interleaved schedules, and with trained
    multi-token-prediction modules (`mtp_layers`) only one of them and only with pp > 1. Full
    recompute is refused with it (the search drops those settings)."""
    if framework != "megatron" or not model.is_moe or mesh.ep == 1 or micro_batches < 2:
        return []
    if mtp_layers > 1 or (mtp_layers and mesh.pp == 1):
        return []
    runs = ("1f1b",) if mesh.pp == 1 else ("interleaved_1f1b",)
    return [o._replace(a2a_overlap=True) for o in options if o.schedule in runs and not o.a2a_overlap]


@lru_cache(maxsize=4096)
def interleaved_options(num_layers: int, pp: int) -> tuple[PipeOption, ...]:
    """`pipeline_options`' interleaved entries of a (layers, pp) pair (cached)."""
    out = []
    for v in range(2, num_layers // pp + 1):
        chunks = pp * v
        for emb, loss in ((False, False), (False, True), (True, True)):
            slots = num_layers + emb + loss
            if slots % chunks == 0 and slots // chunks >= 2 - (not emb and not loss):
                out.append(PipeOption(v, "interleaved_1f1b", emb, loss))
                break
    return tuple(out)


def recompute_modes(framework: str, selective: bool = True) -> list[str]:
    """Recompute modes a framework runs: op-level selective checkpointing is torchtitan's (FSDP2);
    a stack without selective recompute (`SearchConstraints.selective_recompute`) runs none or full."""
    if not selective:
        return ["none", "full"]
    modes = ["none", "selective", "full"]
    return [*modes, "op_sac"] if framework == "fsdp" else modes


def settings(mesh: Mesh, cluster: ClusterSpec, c: SearchConstraints) -> list[Setting]:
    """ZeRO stage (up to `max_zero_stage`) x sharding group x recompute x optimizer offload (and, with optimizer offload under
    ZeRO-3 without pipelines outside Megatron, parameter offload too: ZeRO-Infinity / FSDP CPUOffload).
    Under DeepSpeed ZeRO-3 also: hpZ (`hpz_groups`), NVMe as the offload tier where the cluster has
    NVMe, and, when the constraints allow lossy collectives, qwZ / qgZ."""
    out = []
    zeros = [0, 1] if c.framework == "deepspeed" and mesh.pp > 1 else [0, 1, 2, 3]  # DeepSpeed PP: ZeRO 0-1
    zeros = [z for z in zeros if z <= c.max_zero_stage]
    deepspeed = c.framework == "deepspeed"
    release = c.framework_version if deepspeed else None  # an older DeepSpeed lacks later features
    if deepspeed and not deepspeed_has("zero3", release):
        zeros = [z for z in zeros if z < 3]
    zeropp = deepspeed_has("zeropp", release)
    for zero in _pinned(c.zero_stage, zeros):
        zero3_ds = deepspeed and zero == 3
        hpzs = hpz_groups(mesh, cluster, c.framework) if zero3_ds and zeropp else [1]
        quantized = [(False, False), (True, False), (False, True), (True, True)] if (
            zero3_ds and zeropp and c.allow_quantized_comm and mesh.dp > 1) else [(False, False)]
        tiers = (False, True) if zero3_ds and cluster.has_nvme and deepspeed_has("nvme_offload", release) else (False,)
        for shard in shard_groups(mesh, cluster, c.framework) if zero > 0 else [mesh.dp]:
            for recompute in [c.recompute] if c.recompute else recompute_modes(c.framework, c.selective_recompute):
                for hpz in hpzs:
                    for qwz, qgz in quantized:
                        zpp = dict(hpz=hpz, quantized_weights=qwz, quantized_gradients=qgz)
                        out.append(Setting(zero, shard, recompute, False, **zpp))
                        if not (c.allow_offload and zero > 0):
                            continue
                        for nvme in tiers:
                            out.append(Setting(zero, shard, recompute, True, offload_nvme=nvme, **zpp))
                            if zero == 3 and mesh.pp == 1 and c.framework != "megatron":
                                out.append(Setting(zero, shard, recompute, True, offload_params=True, offload_nvme=nvme, **zpp))
    return out


_LAYOUT_DEFAULTS: dict[str, object] = dict(Layout.model_construct().__dict__)
"""Every Layout field at its default, in field order (all defaults are immutable scalars)."""
assert Layout.__pydantic_post_init__ is None and not Layout.__pydantic_root_model__
assert Layout.model_config.get("extra") != "allow"


def _construct(values: dict[str, object]) -> Layout:
    """`Layout.model_construct(**values)` without its per-field loop: the same `__dict__` (defaults
    overridden by `values`, in field order), fields set, extra and private slots. `values` holds
    field names only."""
    layout = object.__new__(Layout)
    fields = dict(_LAYOUT_DEFAULTS)
    fields.update(values)
    object.__setattr__(layout, "__dict__", fields)
    object.__setattr__(layout, "__pydantic_fields_set__", set(values))
    object.__setattr__(layout, "__pydantic_extra__", None)
    object.__setattr__(layout, "__pydantic_private__", None)
    return layout


class Stack(NamedTuple):
    """The user's software stack, the same for every layout of a search (`SearchConstraints`): the
    framework, its loss kernel, the kernels of the memory-bound ops and of RMSNorm, for FSDP
    whether it is FSDP1 (flat parameters), for Megatron whether its FSDP keeps
    gradient-accumulation fusion, and its attention kernel (resolved)."""

    framework: str
    cross_entropy: str | None = None
    elementwise_kernels: str = "fused"
    norm_kernel: str = "fused"
    fsdp_flat_params: bool = False
    megatron_fsdp_gradient_fusion: bool = True
    attention_kernel: AttentionKernel = "fused"
    stack: str | None = None  # a fine-tuning stack and its techniques (Layout.stack, cost_models.stacks)
    optimizer_state: str = "full"
    optimizer_in_backward: bool = False
    offload_activations: bool = False
    framework_version: str | None = None  # the framework's release (Layout.framework_version); None: today's

    @classmethod
    def of(cls, c: SearchConstraints) -> Stack:
        return cls(
            c.framework, c.cross_entropy, c.elementwise_kernels, c.norm_kernel, c.fsdp_flat_params,
            c.megatron_fsdp_gradient_fusion, c.attention_kernel or default_attention_kernel(c.framework),
            c.stack, c.optimizer_state, c.optimizer_in_backward, c.offload_activations, c.framework_version,
        )


def to_layout(
    mesh: Mesh,
    mb: int,
    option: PipeOption,
    s: Setting,
    stack: Stack,
    *,
    validate: bool = True,
) -> Layout:
    """The Layout of one point of the space, run on `stack`. `validate=False` skips
    pydantic's field checks (`_construct`: `Layout.model_construct`'s result, same field values) for the
    search's internal probes and table meshes, whose values come from the space's own enumeration and
    are never reported."""
    values = dict(
        tp=mesh.tp,
        pp=mesh.pp,
        cp=mesh.cp,
        dp=mesh.dp,
        ep=mesh.ep,
        etp=mesh.etp,
        vpp=option.vpp,
        dp_shard=s.dp_shard,
        zero_stage=s.zero_stage,
        micro_batch=mb,
        recompute=s.recompute,
        sp=mesh.sp_,
        schedule=option.schedule,
        offload_optimizer=s.offload_optimizer,
        offload_params=s.offload_params,
        offload_device="nvme" if s.offload_nvme else "cpu",
        zero_hpz_partition_size=s.hpz,
        zero_quantized_weights=s.quantized_weights,
        zero_quantized_gradients=s.quantized_gradients,
        order=mesh.order,
        framework=stack.framework,
        cross_entropy=stack.cross_entropy,
    )
    if stack.elementwise_kernels != "fused":
        values["elementwise_kernels"] = stack.elementwise_kernels
    if stack.norm_kernel != "fused":
        values["norm_kernel"] = stack.norm_kernel
    if stack.fsdp_flat_params:
        values["fsdp_flat_params"] = True
    if not stack.megatron_fsdp_gradient_fusion:
        values["megatron_fsdp_gradient_fusion"] = False
    if stack.attention_kernel != default_attention_kernel(stack.framework):
        values["attention_kernel"] = stack.attention_kernel
    if stack.framework_version is not None:
        values["framework_version"] = stack.framework_version
    if stack.stack is not None:
        values.update(stack=stack.stack, optimizer_state=stack.optimizer_state,
                      optimizer_in_backward=stack.optimizer_in_backward, offload_activations=stack.offload_activations)
    if option.embedding_slot:
        values["account_for_embedding_in_pipeline_split"] = True
    if option.loss_slot:
        values["account_for_loss_in_pipeline_split"] = True
    if option.a2a_overlap:
        values["moe_a2a_overlap"] = True
    if not mesh.moe_parallel_folding:
        values["moe_parallel_folding"] = False
    return Layout(**values) if validate else _construct(values)  # type: ignore[arg-type]


def table_layout(mesh: Mesh, mb: int, option: PipeOption, s: Setting, stack: Stack, gpus: int, training: TrainingSpec) -> Layout:
    """`to_layout(..., validate=False).resolved(gpus, training)` in one step, for the search's table
    meshes (some 16,000 a search): the same field values and fields set, the derived fields written
    into the new layout rather than into a copy of it. Raises `LayoutError` as `resolved` does."""
    layout = to_layout(mesh, mb, option, s, stack, validate=False)
    derived = layout.resolved_fields(gpus, training)
    layout.__dict__.update(derived)  # the layout is this call's own: `_construct` made its dict and set
    layout.__pydantic_fields_set__.update(derived)
    return layout
