"""Issue 34's findings about what a request may ask, on every backend: bounded sizes and a work
budget before the search, one number reader for every body, lists that never load a plan's JSON,
profiles checked against physics and their plan, runs checked against their plan's cluster."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from model_specs.presets import get_model

from .conftest import PLAN_BODY
from .test_runs import PROFILE, Site


def _deepseek(**fields: Any) -> dict[str, Any]:
    return {**get_model("deepseek-v3").model_dump(mode="json", exclude_defaults=True), **fields}


# ---- sizes and the work budget -----------------------------------------------------------------------


def test_the_one_and_a_half_kilobyte_request_is_refused_at_once_with_its_path(user: httpx.Client) -> None:
    """Issue 34 finding 1: an inline DeepSeek-V3 with 2**20 experts and 1024 layers on 131,072 GPUs
    had no answer after 580 s. Now a 422 naming the field and the bound, in well under a second."""
    body = {"model": _deepseek(num_experts=2**20, num_layers=1024), "cluster": "dgx-h100", "gpus": 131072,
            "training": {"seq_len": 4096, "global_batch": 8192}}
    t0 = time.monotonic()
    r = user.post("/v1/plans", json=body)
    took = time.monotonic() - t0
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "model", "num_experts"] and "4096" in err["msg"]
    print(f"\n1.5 KB request ({len(httpx.Request('POST', 'http://x', json=body).content)} bytes): 422 in {took:.2f} s")


@pytest.mark.parametrize(
    ("field", "spec", "loc"),
    [
        ("model", _deepseek(moe_top_k=65), ["body", "model", "moe_top_k"]),
        ("model", _deepseek(num_layers=1025), ["body", "model", "num_layers"]),
        ("model", {"hf_config": {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
                                 "num_hidden_layers": 5000, "num_attention_heads": 4}},
         ["body", "model", "hf_config"]),  # the message names num_layers and its bound
        ("cluster", {"preset": "dgx-h100", "gpus_per_node": 2048}, ["body", "cluster", "gpus_per_node"]),
        ("cluster", {"preset": "dgx-h100", "intra_node": {"bus_bandwidth": "1e-300 GB/s"}},
         ["body", "cluster", "intra_node", "bus_bandwidth_bytes_per_s"]),
        # a short key's bare number: refused at the key the user wrote, before any bound
        ("cluster", {"preset": "dgx-h100", "intra_node": {"bus_bandwidth": 1e-300}},
         ["body", "cluster", "intra_node", "bus_bandwidth"]),
        ("cluster", {"preset": "dgx-h100", "host_memory": 512}, ["body", "cluster", "host_memory"]),
        ("cluster", {"preset": "dgx-h100", "inter_node": {"nic_bandwidth_bytes_per_s": 1e300}},
         ["body", "cluster", "inter_node", "nic_bandwidth_bytes_per_s"]),
        ("constraints", {"max_tp": 4096}, ["body", "constraints", "max_tp"]),
    ],
)
def test_every_size_that_drives_a_search_is_bounded(user: httpx.Client, field: str, spec: Any, loc: list[Any]) -> None:
    r = user.post("/v1/plans", json={**PLAN_BODY, "model": "tiny", field: spec})
    assert r.status_code == 422, r.text
    hits = [e for e in r.json()["detail"] if e["loc"] == loc]
    assert hits, r.json()["detail"]
    if loc[-1] == "hf_config":
        assert "num_layers: Input should be less than or equal to 1024" in hits[0]["msg"]


def test_a_search_over_its_work_budget_is_refused_before_it_runs(user: httpx.Client) -> None:
    """1024 layers and 256 experts pass every per-field bound, but 131,072 GPUs would enumerate
    ~29 million layouts (the server went to 1.5 GB): refused with both budgets in the message."""
    body = {"model": _deepseek(num_layers=1024), "cluster": "dgx-h100", "gpus": 131072,
            "training": {"seq_len": 4096, "global_batch": 8192}}
    before = user.get("/v1/plans", params={"limit": 1}).json()["total"]
    t0 = time.monotonic()
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body"] and err["type"] == "over_work_budget"
    assert "layouts to price (at most 16,777,216)" in err["msg"] and "pin constraints" in err["msg"]
    assert time.monotonic() - t0 < 30  # counting, not searching (about a second on a loaded 2-core host)
    assert user.get("/v1/plans", params={"limit": 1}).json()["total"] == before  # nothing stored


# ---- one number reader -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "raw", "loc"),
    [
        ("/v1/plans", b'{"model": "tiny", "cluster": {"preset": "local-cpu", "host_memory_bandwidth_bytes_per_s": 1e400},'
                      b' "gpus": 4, "training": {"seq_len": 128, "global_batch": 8}}',
         ["body", "cluster", "host_memory_bandwidth_bytes_per_s"]),
        ("/v1/clusters", b'{"name": "big", "spec": {"preset": "local-cpu", "host_memory_bytes": -1E+999}}',
         ["body", "spec", "host_memory_bytes"]),
        ("/v1/plans", b'{"model": "tiny", "cluster": "local-cpu", "gpus": 99999999999999999999, "training": {}}',
         ["body", "gpus"]),
        ("/v1/plans", b'{"model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": NaN}', ["body", "training"]),
    ],
)
def test_numbers_that_overflow_are_refused_with_their_path(
    user: httpx.Client, path: str, raw: bytes, loc: list[Any]
) -> None:
    """Issue 34 finding 3: 1e400 passed the NaN / infinity filter (a 500 on PostgreSQL, Infinity
    stored on SQLite)."""
    r = user.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == loc and err["type"] == "unsafe_value", err


def test_a_profile_loss_that_overflows_is_refused(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = Site(server, user)
    run = site.queue(tiny_plan["id"])
    attempt = site.lease().json()["attempt"]
    raw = b'{"step_s": 0.2, "losses": [4.0, 1e400]}'
    r = site.http.put(f"/v1/runs/{run['id']}/profile", content=raw, headers={"content-type": "application/json"},
                      params={"agent_id": site.agent_id, "attempt": attempt})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "losses", 1], r.text


@pytest.mark.parametrize("headers", [{"content-type": "application/json"}, {}])
def test_deep_nesting_is_a_422_without_a_token_or_a_traceback(
    anon: httpx.Client, server: Any, headers: dict[str, str]
) -> None:
    """Issue 34 finding 3: JSON nested 5,000 deep was a 500 (RecursionError) even without a
    token, and logged a traceback each time. Without a Content-Type FastAPI reads JSON too."""
    size_before = server.log_path.stat().st_size
    r = anon.post("/v1/plans", content=b"[" * 5000 + b"]" * 5000, headers=headers)
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body"] and "nested more than 64" in err["msg"]
    assert "Traceback" not in server.log_path.read_bytes()[size_before:].decode(errors="replace")


def test_global_batch_tokens_is_bounded_like_global_batch(user: httpx.Client) -> None:
    r = user.post("/v1/plans", json={**PLAN_BODY, "training": {"seq_len": 1, "global_batch_tokens": 2**30}})
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "training", "global_batch_tokens"] and "16777216" in err["msg"]


def test_query_numbers_are_typed(anon: httpx.Client) -> None:
    for params in ({"limit": "1e400"}, {"gpus": "1e400"}, {"offset": "inf"}):
        r = anon.get("/v1/plans", params=params)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", next(iter(params))], r.text


# ---- lists -----------------------------------------------------------------------------------------------


def test_listing_plans_never_loads_their_json(server: Any, tiny_plan: dict[str, Any]) -> None:
    """Issue 34 finding 2: GET /v1/plans parsed every row's whole plan JSON (~125 KB) for a
    summary that does not use it. The route's SQL names the summary columns only."""
    from sqlalchemy import event

    from api.routes.plans import list_plans

    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(server.db.engine, "before_cursor_execute", record)
    try:
        page = list_plans(server.db, limit=200)
    finally:
        event.remove(server.db.engine, "before_cursor_execute", record)
    assert page.total >= 1 and any(p.id == tiny_plan["id"] for p in page.items)
    selects = [s for s in statements if "FROM plans" in s]
    assert selects and not any("plans.plan" in s.replace("plans.plan_", "") for s in selects), selects


# ---- profiles against physics and their plan -------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "loc", "needle"),
    [
        ({"step_s": 1e-9, "step_times_s": [1e-9] * 3}, ["body", "step_s"], "faster than the hardware allows"),
        ({"step_times_s": [0.2, 1e-9, 0.2]}, ["body", "step_times_s", 1], "faster than the hardware allows"),
        ({"step_s": 1e300, "step_times_s": []}, ["body", "step_s"], "a unit error"),
        ({"peak_memory_bytes_per_rank": [2**62]}, ["body", "peak_memory_bytes_per_rank", 0], "host memory"),
        ({"peak_memory_bytes_per_rank": [1000] * 5}, ["body", "peak_memory_bytes_per_rank"], "the plan runs 4"),
        ({"tokens_per_s": 1e15}, ["body", "tokens_per_s"], "faster than the hardware allows"),
        ({"mfu": 50.0}, ["body", "mfu"], "no run beats"),
        ({"tokens_per_step": 7}, ["body", "tokens_per_step"], "8 sequences of 128 tokens = 1024"),
    ],
)
def test_an_impossible_profile_is_refused_with_the_reason(
    server: Any, user: httpx.Client, tiny_plan: dict[str, Any], change: dict[str, Any], loc: list[Any], needle: str
) -> None:
    """Issue 34 finding 4: 1e-9 s steps and 1e30-byte peaks were stored with 201 (and the former threw
    away the cluster's fit)."""
    site = Site(server, user)
    run = site.queue(tiny_plan["id"])
    attempt = site.lease().json()["attempt"]
    r = site.http.put(f"/v1/runs/{run['id']}/profile", json={**PROFILE, **change},
                      params={"agent_id": site.agent_id, "attempt": attempt})
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == loc and needle in err["msg"] and err["type"] == "implausible_measurement", err
    ok = site.http.put(f"/v1/runs/{run['id']}/profile", json=PROFILE, params={"agent_id": site.agent_id, "attempt": attempt})
    assert ok.status_code == 201, ok.text  # the same upload without the impossible value is stored


# ---- runs against their plan's cluster ----------------------------------------------------------------


def test_the_process_count_is_the_plans(user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    """Issue 34 finding 6: a 2-GPU plan was queued with 12 processes per node."""
    r = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json={"cluster": "local-cpu", "launch": {"nproc_per_node": 12}})
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "launch", "nproc_per_node"] and "is for 4 GPUs" in err["msg"], err


def test_a_plan_priced_for_other_gpus_is_not_queued_on_a_known_cluster(user: httpx.Client) -> None:
    """Issue 34 finding 6: a Llama-3-405B plan for 1,024 H100 was accepted for the CPU cluster."""
    body = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "training": {"seq_len": 4096, "global_batch": 16}}
    plan = user.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    r = user.post(f"/v1/plans/{plan.json()['id']}/runs", json={"cluster": "local-cpu"})
    assert r.status_code == 409, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "cluster"] and "8 x H100-80GB (dgx-h100)" in err["msg"] and "has cpu GPUs" in err["msg"]
    many = user.post("/v1/plans", json={**body, "gpus": 64})
    assert many.status_code == 201, many.text
    r = user.post(f"/v1/plans/{many.json()['id']}/runs", json={"cluster": "dgx-h100"})
    assert r.status_code == 409 and "8 GPUs per node" in r.json()["detail"][0]["msg"], r.text


def test_what_queueing_cannot_check_is_said_in_the_runs_notes(user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    ok = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json={"cluster": "local-cpu"})
    assert ok.status_code == 201 and ok.json()["notes"] == [], ok.text
    unknown = f"rack-{uuid.uuid4().hex[:8]}"
    r = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json={"cluster": unknown})
    assert r.status_code == 201, r.text
    [note] = r.json()["notes"]
    assert f"{unknown!r} is neither a preset nor a registered team cluster" in note and "4 x cpu (local-cpu)" in note
    lab = f"lab-{uuid.uuid4().hex[:8]}"
    assert user.post("/v1/clusters", json={"name": lab, "spec": {"preset": "local-cpu", "host_memory": "8 GiB"}}).status_code == 201
    r = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json={"cluster": lab})
    assert r.status_code == 201, r.text
    [note] = r.json()["notes"]
    assert "host_memory_bytes differ" in note and "does not calibrate it" in note
    assert user.get(f"/v1/runs/{r.json()['id']}").json()["notes"] == [note]


def test_a_team_spec_stored_before_the_bounds_is_refused_by_name(server: Any, user: httpx.Client) -> None:
    """A team cluster stored with a bandwidth the bounds now refuse: a 422 naming it and the field,
    never a 500."""
    from api.models import TeamCluster
    from cluster_specs.presets import get_cluster

    name = f"old-{uuid.uuid4().hex[:8]}"
    spec = get_cluster("local-cpu").model_dump(mode="json")
    spec["intra_node"]["bus_bandwidth_bytes_per_s"] = 1e-300
    with server.db.write_session() as s:
        s.add(TeamCluster(name=name, spec=spec))
    r = user.post("/v1/plans", json={**PLAN_BODY, "cluster": name})
    assert r.status_code == 422, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "cluster"] and err["type"] == "stale_team_spec"
    assert f"team cluster {name!r}" in err["msg"] and "intra_node.bus_bandwidth_bytes_per_s" in err["msg"]
    # lists and the spec itself still answer, saying why it is unusable
    one = user.get(f"/v1/clusters/{name}")
    assert one.status_code == 200 and one.json()["spec"] is None, one.text
    assert one.json()["stale"].startswith("intra_node.bus_bandwidth_bytes_per_s")
    listed = user.get("/v1/clusters", params={"source": "team", "limit": 200})
    assert listed.status_code == 200 and name in {c["name"] for c in listed.json()["items"]}, listed.text


def test_a_plan_stored_before_the_bounds_is_a_409_not_a_500(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    from sqlalchemy import insert

    from api.models import PlanRow

    stale = tiny_plan["plan"]
    stale = {**stale, "inputs": {**stale["inputs"], "cluster": {**stale["inputs"]["cluster"], "gpus_per_node": 4096}}}
    with server.db.write_session() as s:
        plan_id = s.execute(insert(PlanRow.__table__).values(  # type: ignore[arg-type]
            model_name="tiny", cluster_name="local-cpu", gpus=4, seq_len=128, global_batch=8, precision="bf16",
            feasible=True, calibration="", plan=stale,
        ).returning(PlanRow.__table__.c.id)).scalar_one()
    for r in (user.get(f"/v1/plans/{plan_id}"), user.get(f"/v1/plans/{plan_id}/export/torchrun"),
              user.post(f"/v1/plans/{plan_id}/runs", json={"cluster": "local-cpu"})):
        assert r.status_code == 409, r.text
        [err] = r.json()["detail"]
        assert err["type"] == "stale_plan" and "inputs.cluster.gpus_per_node" in err["msg"], err
    assert user.get("/v1/plans", params={"limit": 200}).status_code == 200
