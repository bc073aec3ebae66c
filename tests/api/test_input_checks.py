"""The API refuses what `autopar plan` / `autopar evaluate` refuse, from the same checks
(`planner.inputs`): 422 with the field's path, never a stored plan priced in another precision."""

from __future__ import annotations

import httpx


def test_fp8_on_a100_is_a_422_at_the_precision(user: httpx.Client) -> None:
    body = {"model": "tiny", "cluster": "dgx-a100-80g", "gpus": 8,
            "training": {"seq_len": 128, "global_batch": 8, "precision": "fp8"}}
    for path in ("/v1/plans", "/v1/evaluate"):
        r = user.post(path, json=body)
        assert r.status_code == 422, (path, r.text)
        (item,) = r.json()["detail"]
        assert item["loc"] == ["body", "training", "precision"], path
        assert "fp8 on A100-80GB" in item["msg"] and "bf16, fp16, fp32" in item["msg"], path


def test_pinned_degrees_that_leave_nothing_to_search_are_a_422(user: httpx.Client) -> None:
    body = {"model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8},
            "constraints": {"tp": 3}}
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "constraints", "tp"]
    assert "tp=3 does not divide 4 GPUs" in r.json()["detail"][0]["msg"]


def test_a_cluster_value_without_its_unit_is_a_422(user: httpx.Client) -> None:
    body = {"model": "tiny", "cluster": {"preset": "local-cpu", "host_memory": 512}, "gpus": 4,
            "training": {"seq_len": 128, "global_batch": 8}}
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    assert "host_memory: 512 has no unit" in r.text
