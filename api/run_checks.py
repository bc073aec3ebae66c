"""What queueing a plan on a cluster checks (`POST /v1/plans/{id}/runs`, `check_run`).

The runner agent launches a run on its own node, `torchrun --standalone --nproc-per-node=N`, one
process per GPU the plan was priced for. So:

- the process count is the plan's: `launch.nproc_per_node`, when given, must equal the plan's GPUs
  (422 otherwise; the agent refuses a lease that disagrees too, `agent.launcher.LaunchSpec`);
- when the run's cluster name is one the service knows (a preset, or a team cluster registered with
  POST /v1/clusters), its GPU must be the one the plan was priced for and one of its nodes must
  hold the plan's GPUs (409 otherwise, with what the plan was priced for); a known cluster whose
  other figures differ from the spec the plan was priced with (bandwidths, memory, ...) is accepted
  with a note saying which differ: the prediction may then be off, and the profile does not
  calibrate that cluster (`api.calibration`);
- a name the service does not know (agents may serve any name their token names) cannot be
  checked: the run is accepted with a note saying so.

The notes are stored with the run (`runs.notes`) and shown in its answer."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import ApiError, conflict
from api.models import TeamCluster
from api.resolve import preset_cluster
from api.schemas import RunCreate
from api.views import stored_plan
from cluster_specs.spec import ClusterSpec

DESCRIPTIVE = frozenset({"name", "description", "source"})
"""ClusterSpec fields that describe a cluster without changing a price."""


def known_cluster(session: Session, name: str) -> ClusterSpec | None:
    """The spec of a preset or registered team cluster of that name, else None."""
    spec = preset_cluster(name)
    if spec is not None:
        return spec
    stored = session.scalar(select(TeamCluster.spec).where(TeamCluster.name == name))
    if stored is None:
        return None
    try:
        return ClusterSpec(**stored)
    except ValueError:  # stored before today's bounds: known, but not comparable
        return None


def _differences(priced: ClusterSpec, target: ClusterSpec) -> list[str]:
    return [
        f for f in type(priced).model_fields
        if f not in DESCRIPTIVE and getattr(priced, f) != getattr(target, f)
    ]


def check_run(session: Session, plan_id: int, plan: dict[str, Any], body: RunCreate) -> list[str]:
    """Raise (422 / 409) when the run cannot be what the plan priced; return the notes to store."""
    stored_plan(plan_id, plan)  # a plan stored before the bounds and outside them is a 409
    inputs = plan.get("inputs") or {}
    gpus = int(inputs.get("gpus") or 0)
    priced = ClusterSpec(**inputs["cluster"])
    nproc = body.launch.nproc_per_node
    if nproc is not None and nproc != gpus:
        raise ApiError(
            422, f"the agent starts nproc_per_node processes on one node (torchrun --standalone), one per GPU of the "
            f"plan: plan {plan_id} is for {gpus} GPUs, so give {gpus} or leave it out (got {nproc})",
            ["body", "launch", "nproc_per_node"], "value_error",
        )
    target = known_cluster(session, body.cluster)
    what = f"{gpus} x {priced.gpu.name} ({priced.name})"
    if target is None:
        return [
            f"cluster {body.cluster!r} is neither a preset nor a registered team cluster (POST /v1/clusters): the "
            f"service cannot check that its GPUs are the ones plan {plan_id} was priced for, {what}; the run's "
            "profile is compared with that prediction all the same"
        ]
    if target.gpu.name != priced.gpu.name:
        raise conflict(
            f"plan {plan_id} was priced for {what}; cluster {body.cluster!r} has {target.gpu.name} GPUs. Plan the job "
            f"for it (POST /v1/plans with \"cluster\": \"{body.cluster}\") and queue that plan",
            ["body", "cluster"],
        )
    if gpus > target.gpus_per_node:
        raise conflict(
            f"plan {plan_id} needs {gpus} GPUs on one node (the agent launches torchrun --standalone); cluster "
            f"{body.cluster!r} has {target.gpus_per_node} GPUs per node",
            ["body", "cluster"],
        )
    differ = _differences(priced, target)
    if differ:
        return [
            f"plan {plan_id} was priced for {what}, whose {', '.join(differ)} differ from cluster {body.cluster!r}'s: "
            "its prediction may be off on this cluster, and the run's profile does not calibrate it"
        ]
    return []
