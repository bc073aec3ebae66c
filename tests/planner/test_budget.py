"""The work estimate before a search (planner.budget): it counts exactly the layouts the search
generates, grows with what drives the search, and a budget refuses with both bounds named."""

from __future__ import annotations

import pytest

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.budget import Budget, WorkEstimate, estimate_work
from planner.plan import SearchConstraints
from planner.search import search


@pytest.mark.parametrize(
    ("model", "cluster", "gpus", "seq", "batch", "constraints"),
    [
        ("tiny", "local-cpu", 8, 128, 16, SearchConstraints()),
        ("tiny-moe", "dgx-h100", 16, 256, 32, SearchConstraints()),
        ("tiny", "dgx-h100", 16, 256, 64, SearchConstraints(framework="fsdp")),
        ("tiny-mla", "gb200-nvl72", 8, 256, 16, SearchConstraints(framework="deepspeed")),
    ],
)
def test_the_estimate_counts_the_layouts_the_search_generates(
    model: str, cluster: str, gpus: int, seq: int, batch: int, constraints: SearchConstraints
) -> None:
    m, c, t = get_model(model), get_cluster(cluster), TrainingSpec(seq_len=seq, global_batch=batch)
    work = estimate_work(m, t, c, gpus, constraints)
    plan = search(m, t, c, gpus, constraints)
    assert work.layouts == plan.stats.generated
    assert work.tables >= 1 and work.bytes > 0


def test_the_estimate_grows_with_gpus_and_layers() -> None:
    t = TrainingSpec(seq_len=4096, global_batch=1024)
    c = get_cluster("dgx-h100")
    base = get_model("llama3-8b")
    small = estimate_work(base, t, c, 64)
    more_gpus = estimate_work(base, t, c, 1024)
    deeper = estimate_work(base.model_copy(update={"num_layers": 512}), t, c, 64)
    assert more_gpus.layouts > small.layouts and more_gpus.meshes > small.meshes
    assert deeper.bytes > small.bytes and deeper.layouts > small.layouts  # interleaving: one vpp per layer split


def test_a_budget_names_what_is_over_and_the_bounds() -> None:
    budget = Budget(max_layouts=1000, max_bytes=2**30)
    assert budget.refusal(WorkEstimate(meshes=3, tables=10, layouts=1000, bytes=2**30)) is None
    why = budget.refusal(WorkEstimate(meshes=30, tables=700, layouts=5000, bytes=3 * 2**30))
    assert why is not None
    assert "5,000 layouts to price (at most 1,000)" in why and "about 3.0 GiB to hold (at most 1.0 GiB)" in why
    assert "from 30 meshes and 700 stage tables" in why and "pin constraints" in why
