"""`"auto"` knobs in the job contract (cost_models.auto_knobs, cost_models.jobs)."""

from __future__ import annotations

from cost_models.auto_knobs import MAX_COMBINATIONS
from cost_models.estimate import estimate
from cost_models.jobs import resolve_cluster, resolve_model, run_job
from cost_models.layout import Layout
from model_specs.spec import TrainingSpec

JOB = {"model": "llama3-70b", "cluster": "dgx-h100", "gpus": 64, "training": {"seq_len": 8192, "global_batch": 128}}


def test_auto_picks_the_fastest_fitting_combination_with_the_rest_pinned() -> None:
    r = run_job({**JOB, "layout": {"tp": 8, "pp": 8, "micro_batch": "auto", "recompute": "auto"}})
    assert r["ok"], r
    auto = r["auto"]
    assert auto["knobs"] == ["micro_batch", "recompute"] and auto["combinations"] == 7 * 3
    assert (r["layout"]["tp"], r["layout"]["pp"]) == (8, 8)
    assert r["fits"] and auto["fitting"] + auto["invalid"] + auto["over_memory"] == auto["combinations"]
    # no fitting combination is faster than the chosen one
    model, cluster = resolve_model("llama3-70b"), resolve_cluster("dgx-h100")
    training = TrainingSpec(seq_len=8192, global_batch=128)
    for mb in (1, 2, 4):
        for rc in ("none", "selective", "full"):
            est = estimate(model, training, cluster, 64, Layout(tp=8, pp=8, micro_batch=mb, recompute=rc))
            if est.fits:
                assert est.step_s >= r["step_s"] * (1 - 1e-12)
    assert auto["runner_up_slower_pct"] >= 0


def test_auto_refuses_degrees_and_too_many_combinations() -> None:
    r = run_job({**JOB, "layout": {"tp": "auto"}})
    assert not r["ok"] and r["error"].startswith("layout.tp: 'auto' is supported for")
    many = {"micro_batch": "auto", "recompute": "auto", "zero_stage": "auto", "offload_optimizer": "auto", "vpp": "auto",
            "schedule": "auto", "pp": 8}
    r = run_job({**JOB, "layout": many})
    assert not r["ok"] and f"at most {MAX_COMBINATIONS}" in r["error"]


def test_auto_explains_when_nothing_fits() -> None:
    r = run_job({**JOB, "gpus": 8, "layout": {"recompute": "auto"}})
    assert not r["ok"] and "over the GPU memory" in r["error"]
