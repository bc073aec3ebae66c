"""planner.inputs: the checks the CLI and the API share, each problem at its field with its reason."""

from __future__ import annotations

import pytest

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.inputs import InputError, check_plan, evaluation_problems, plan_problems
from planner.plan import SearchConstraints

TR = TrainingSpec(seq_len=4096, global_batch=64)


def _locs(problems: list) -> list[tuple[str, ...]]:
    return [p.loc for p in problems]


def test_precision_must_be_on_the_gpus_datasheet() -> None:
    v100 = get_cluster("dgx-a100-80g").model_copy(update={"gpu": get_cluster("dgx-a100-80g").gpu.model_copy(
        update={"name": "V100-like", "peak_flops_per_s": {"fp16": 1.25e14, "fp32": 1.57e13}})})
    (bf16,) = plan_problems(get_model("llama3-8b"), TR, v100, 8)
    assert bf16.loc == ("training", "precision") and "no BF16 tensor cores" in bf16.message
    fp8 = TR.model_copy(update={"precision": "fp8"})
    assert _locs(evaluation_problems(fp8, get_cluster("dgx-a100-80g"), 8)) == [("training", "precision")]
    assert evaluation_problems(fp8, get_cluster("dgx-h100"), 8) == []


def test_gpu_counts_and_pins() -> None:
    model, h100 = get_model("mixtral-8x7b"), get_cluster("dgx-h100")
    assert "at least 1 GPU" in plan_problems(model, TR, h100, -8)[0].message
    assert "not a whole number" in plan_problems(model, TR, h100, True)[0].message
    assert _locs(plan_problems(model, TR, h100, 64, SearchConstraints(ep=3))) == [("constraints", "ep")]
    assert plan_problems(model, TR, h100, 64, SearchConstraints(ep=8)) == []
    assert _locs(plan_problems(model, TR, h100, 64, SearchConstraints(tp=2, pp=4, cp=2, dp=2))) == [("constraints", "dp")]
    with pytest.raises(InputError, match="tp=3 does not divide 64 GPUs") as info:
        check_plan(model, TR, h100, 64, SearchConstraints(tp=3))
    assert _locs(info.value.problems) == [("constraints", "tp")]
