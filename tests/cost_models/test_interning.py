"""Equal job inputs share one object (and so the pricing memos); nothing about a search changes.
The memo the pricing memos are made of keeps the objects its keys name by id."""

import gc
import json
import weakref

from cluster_specs.presets import get_cluster
from cost_models.interning import KeptMemo, canonical
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.search import search


def test_equal_inputs_map_to_one_object() -> None:
    # other tests in this process may have interned equal values first: compare through canonical
    first = TrainingSpec(seq_len=2048, global_batch=64)
    again = TrainingSpec(seq_len=2048, global_batch=64)
    other = TrainingSpec(seq_len=4096, global_batch=64)
    assert again is not first and again == first
    assert canonical(again) is canonical(first)
    assert canonical(first) == first
    assert canonical(other) is not canonical(first)
    assert canonical(other) == other


def test_unhashable_values_pass_through() -> None:
    value = {"not": "hashable"}
    assert canonical(value) is value


def test_search_on_copies_gives_the_same_plan() -> None:
    model, cluster = get_model("tiny-moe"), get_cluster("dgx-h100")
    plans = []
    for _ in range(2):
        plan = search(model.model_copy(deep=True), TrainingSpec(seq_len=2048, global_batch=128), cluster.model_copy(deep=True), 32)
        data = json.loads(plan.model_dump_json())
        data.pop("created_at", None)
        data["stats"].pop("seconds")
        plans.append(data)
    assert plans[0] == plans[1]


class _Job:
    """A stand-in job object: weak-referenceable, hashed by identity."""


def test_a_kept_memo_keeps_what_its_keys_name_by_id() -> None:
    """An entry keeps the objects whose ids its key holds, so no other object takes those ids while
    it exists and a hit needs no identity check; past its limit the memo starts over and lets them go."""
    memo: KeptMemo[str] = KeptMemo(2)
    job = _Job()
    gone = weakref.ref(job)
    key = (id(job), "shape")
    assert memo.get(key) is None
    assert memo.put(key, job, "priced") == "priced"
    del job
    gc.collect()
    assert gone() is not None and memo.get(key) == "priced"  # kept alive by its entry
    memo.put(("other",), None, "second")
    assert len(memo) == 2 and memo.values() == ["priced", "second"]
    memo.put(("third",), None, "third")  # at its limit: starts over
    gc.collect()
    assert len(memo) == 1 and memo.get(key) is None and gone() is None
