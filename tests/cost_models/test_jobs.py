"""The batch contract: valid jobs give the documented keys; invalid ones name field and reason."""

import json

import pytest

from cost_models.jobs import run_job
from model_specs.presets import get_model

BASE = {
    "model": "llama3-8b",
    "cluster": "dgx-h100",
    "gpus": 16,
    "training": {"seq_len": 8192, "global_batch": 32},
    "layout": {"tp": 2, "pp": 2},
}


def job(**changes: object) -> dict:
    out = json.loads(json.dumps(BASE))
    out.update(changes)
    return out


def test_result_has_the_contract_keys() -> None:
    r = run_job(job())
    assert r["ok"] is True
    for key in ("fits", "step_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu"):
        assert key in r
    assert r["model"]["params"] == 8_030_261_248 == r["model"]["active_params"]
    assert r["memory"]["peak_bytes"] == max(s["total_bytes"] for s in r["memory"]["stages"])
    assert set(r["memory"]["breakdown"]) >= {"parameters_bytes", "activations_bytes", "optimizer_bytes"}
    assert r["step_s"] == pytest.approx(sum(r["time"]["breakdown"].values()))
    assert r["tokens_per_s"] == pytest.approx(32 * 8192 / r["step_s"])
    assert r["layout"]["dp"] == 4 and r["layout"]["grad_accum"] == 8


def test_model_as_hf_config_and_fields() -> None:
    hf = {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    }
    a = run_job(job(model={"hf_config": hf}))
    fields = get_model("llama3-8b").model_dump()
    b = run_job(job(model=fields))
    c = run_job(job())
    assert a["ok"] and b["ok"]
    assert a["model"]["params"] == b["model"]["params"] == c["model"]["params"]
    assert b["step_s"] == pytest.approx(c["step_s"])


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"model": "no-such-model"}, "model: unknown model 'no-such-model'"),
        ({"cluster": "no-such-cluster"}, "cluster"),
        ({"gpus": 0}, "gpus: Input should be greater than 0"),
        ({"training": {"seq_len": 8192}}, "training: global_batch (sequences) or global_batch_tokens is required"),
        ({"layout": {"tp": 3}}, "layout.dp: tp x pp x cp = 3 does not divide the 16 GPUs"),
        ({"layout": {"tp": 2, "pp": 2, "vpp": 3}}, "layout.vpp"),
        ({"layout": {"tp": 2, "bogus": 1}}, "layout.bogus: Extra inputs are not permitted"),
        ({"model": {"hf_config": {"model_type": "llama"}}}, "model: llama config: missing required field"),
    ],
)
def test_invalid_jobs_name_field_and_reason(changes: dict, fragment: str) -> None:
    r = run_job(job(**changes))
    assert r["ok"] is False
    assert fragment in r["error"], r["error"]


def test_booleans_are_not_numbers() -> None:
    base = {"model": "tiny", "cluster": "local-cpu", "gpus": 2, "training": {"seq_len": 64, "global_batch": 4}}
    assert run_job({**base, "gpus": True})["error"] == "gpus: true is not a number"
    assert run_job({**base, "layout": {"tp": True}})["error"] == "layout.tp: true is not a number"
    assert run_job({**base, "training": {"seq_len": 64, "global_batch": False}})["error"].startswith("training.global_batch")
    assert run_job({**base, "layout": {"offload_optimizer": True, "zero_stage": 1}})["ok"]  # a real boolean field


def test_partition_auto_keeps_the_faster_fitting_cut() -> None:
    from planner.partitioner import cp_sat_partitioner

    out = run_job(job(partition="auto"), cp_sat_partitioner)
    assert out["ok"], out
    cut = out["auto"]["partition"]
    assert sum(cut["chosen"]) == 32 and cut["default"] == [16, 16]
    assert out["step_s"] <= cut["default_step_s"]
    again = run_job(job(partition=cut["chosen"]))  # the chosen cut, priced as an explicit partition
    assert again["step_s"] == pytest.approx(out["step_s"])


def test_partition_auto_cuts_layers_that_do_not_divide_the_stages() -> None:
    from planner.partitioner import cp_sat_partitioner

    uneven = job(layout={"tp": 2, "pp": 2, "vpp": 3}, partition="auto")  # 32 layers over 6 chunks
    assert "do not divide the 32 layers" in run_job({**uneven, "partition": None})["error"]
    out = run_job(uneven, cp_sat_partitioner)
    assert out["ok"], out
    assert out["auto"]["partition"]["from"] == "cp-sat" and "not valid" in out["auto"]["partition"]["why"]
    assert sum(out["auto"]["partition"]["chosen"]) == 32 and len(out["auto"]["partition"]["chosen"]) == 6
    # with auto knobs, the knobs are chosen on the near-even cut, then the cut is refined
    knobs = run_job({**uneven, "layout": {"tp": 2, "pp": 2, "vpp": 3, "micro_batch": "auto"}}, cp_sat_partitioner)
    assert knobs["ok"] and knobs["auto"]["knobs"] == ["micro_batch"] and "partition" in knobs["auto"]


def test_partition_auto_needs_a_partitioner() -> None:
    out = run_job(job(partition="auto"))
    assert not out["ok"] and out["error"].startswith("partition:")
