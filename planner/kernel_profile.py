"""Plans and measured kernel profiles: what a plan needs measured, and pricing with a profile.

- `plan_needs(plan)`: the atlas entries pricing the plan's chosen layout looks up
  (`cost_models.kernel_needs.needed_entries`), what `autopar profile` measures.
- `search_with_profile(...)`: the search (`planner.finetune.search_finetune`, as `autopar plan` and
  the service run it) on the cluster with `profile` layered over its GPU's atlas
  (`cost_models.kernels.overlay`), the Plan saying so (`profile_note`): its `kernel_profile`
  names the profile's device, date and digest and which of the chosen layout's lookups it measured,
  and a sentence of `why` says the same.
"""

from __future__ import annotations

from typing import Any

from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration
from cost_models.kernels.overlay import digest, profiled_cluster
from cost_models.kernels.record import Lookups
from cost_models.kernels.schema import AtlasFile
from model_specs.spec import ModelSpec, TrainingSpec
from planner.plan import Plan, SearchConstraints

LISTED = 40
"""Entries of the profile a plan lists by name (the counts cover all of them)."""


def plan_needs(plan: Plan, cluster: ClusterSpec | None = None, calibration: Calibration | None = None) -> Lookups:
    """The atlas lookups of pricing `plan`'s chosen layout (on `cluster`, default the plan's own)."""
    from cost_models.kernel_needs import needed_entries
    from cost_models.stages import StagePartition

    if plan.best is None:
        raise ValueError("best: the plan has no layout that fits, so nothing to measure")
    inputs, layout = plan.inputs, plan.best.layout
    partition = StagePartition.explicit(plan.best.partition, layout) if plan.best.partition else None
    return needed_entries(inputs.model, inputs.training, cluster or inputs.cluster, inputs.gpus, layout, partition,
                          calibration)


def _profile_keys(doc: AtlasFile) -> tuple[set, set, set]:
    gemm = {(p.m, p.n, p.k, "fp8" if p.dtype == "fp8" else "bf16") for p in doc.gemm}
    attention = {(p.kernel, p.head_dim, p.seq_len, p.causal, p.pass_) for p in doc.attention}
    # a forward + backward point with its forward gives the backward (`cost_models.kernels.attention`)
    attention |= {(k, d, s, c, "bwd") for k, d, s, c, pass_ in list(attention)
                  if pass_ == "fwd_bwd" and (k, d, s, c, "fwd") in attention}
    collectives = {(p.op, p.span, p.ranks, p.nodes, p.bytes) for p in doc.collectives}
    return gemm, attention, collectives


def describe_gemm(key: tuple) -> str:
    m, n, k, dtype = key
    return f"gemm {m}x{n}x{k} {dtype}"


def describe_attention(key: tuple) -> str:
    kernel, d, s, causal, pass_ = key
    return f"attention {kernel} d{d} s{s} {'causal' if causal else 'full'} {pass_}"


def describe_collective(key: tuple) -> str:
    op, span, ranks, nodes, nbytes = key
    return f"{op} {span} {ranks} ranks / {nodes} nodes {nbytes} B"


def profile_note(plan: Plan, doc: AtlasFile, cluster: ClusterSpec) -> dict[str, Any]:
    """What `plan.kernel_profile` says (module doc): the profile and which of the chosen layout's
    lookups (on `cluster`, the profiled one) fall on its measured points."""
    prov = doc.provenance
    note: dict[str, Any] = {
        "gpu": doc.gpu, "digest": digest(doc),
        "device": prov.device if prov else "", "measured_at": prov.measured_at if prov else "",
        "command": prov.command if prov else "", "software": prov.software if prov else "",
        "points": len(doc.gemm) + len(doc.attention) + len(doc.memory) + len(doc.collectives),
        "needed": 0, "from_profile": 0, "entries": [],
    }
    if plan.best is None:
        return note
    needs = plan_needs(plan, cluster)
    gemm, attention, collectives = _profile_keys(doc)
    hits = ([describe_gemm(k) for k in sorted(needs.gemm & gemm)]
            + [describe_attention(k) for k in sorted(needs.attention & attention)]
            + [describe_collective(k) for k in sorted(needs.collectives & collectives)])
    note.update(needed=len(needs), from_profile=len(hits), entries=hits[:LISTED])
    return note


def sentence(note: dict[str, Any]) -> str:
    """One line for `Plan.why` from a `profile_note`."""
    where = f"measured on {note['device']} at {note['measured_at']}" if note["device"] else "measured"
    return (f"Kernels priced with this cluster's profile ({note['points']} points of {note['gpu']}, {where}, "
            f"digest {note['digest']}) over the shipped atlas: {note['from_profile']} of the chosen layout's "
            f"{note['needed']} kernel lookups are its own measurements.")


def with_profile_note(plan: Plan, doc: AtlasFile, cluster: ClusterSpec) -> Plan:
    """`plan` with its `kernel_profile` and a `why` sentence (module doc)."""
    note = profile_note(plan, doc, cluster)
    return plan.model_copy(update={"kernel_profile": note, "why": [*plan.why, sentence(note)]})


def search_with_profile(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: int, constraints: SearchConstraints,
    profile: AtlasFile | None, calibration: Calibration | None = None, progress: Any = None,
) -> Plan:
    """The search on `cluster`, its GPU priced with `profile` layered over the atlas (module doc);
    without a profile, the search alone. A profile of another GPU is a ValueError naming it."""
    from planner.finetune import search_finetune

    if profile is None:
        return search_finetune(model, training, cluster, gpus, constraints, calibration=calibration, progress=progress)
    profiled = profiled_cluster(cluster, profile)
    plan = search_finetune(model, training, profiled, gpus, constraints, calibration=calibration, progress=progress)
    return with_profile_note(plan, profile, profiled)
