"""Plans, exports and evaluations over HTTP, on every backend."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from planner.exporters import formats

PLAN_BODY: dict[str, Any] = {
    "model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8},
}


def test_create_plan_returns_the_stored_plan(user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    assert tiny_plan["feasible"] is True and tiny_plan["model"] == "tiny" and tiny_plan["cluster"] == "local-cpu"
    best = tiny_plan["plan"]["best"]
    world = best["layout"]["dp"] * best["layout"]["tp"] * best["layout"]["pp"] * best["layout"]["cp"]
    assert world == 4
    assert tiny_plan["tokens_per_s"] == pytest.approx(best["estimate"]["tokens_per_s"])
    assert tiny_plan["plan"]["calibration"] == tiny_plan["calibration"] != ""
    r = user.get(f"/v1/plans/{tiny_plan['id']}")
    assert r.status_code == 200
    assert r.json() == tiny_plan


def test_list_filters_sorts_and_paginates(user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    small = user.post("/v1/plans", json={**PLAN_BODY, "gpus": 2})
    assert small.status_code == 201, small.text
    r = user.get("/v1/plans", params={"model": "tiny", "cluster": "local-cpu", "gpus": 2})
    body = r.json()
    assert r.status_code == 200 and body["total"] >= 1
    assert all(p["gpus"] == 2 and p["model"] == "tiny" for p in body["items"])
    assert "plan" not in body["items"][0]  # summaries only

    r = user.get("/v1/plans", params={"model": "tiny", "sort": "-tokens_per_s", "limit": 200})
    speeds = [p["tokens_per_s"] for p in r.json()["items"] if p["tokens_per_s"] is not None]
    assert speeds == sorted(speeds, reverse=True) and len(speeds) >= 2

    first = user.get("/v1/plans", params={"limit": 1, "offset": 0}).json()
    second = user.get("/v1/plans", params={"limit": 1, "offset": 1}).json()
    assert first["total"] == second["total"] >= 2
    assert first["items"][0]["id"] != second["items"][0]["id"]

    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert user.get("/v1/plans", params={"created_after": future}).json()["total"] == 0
    assert user.get("/v1/plans", params={"created_before": future}).json()["total"] == first["total"]


SHIPPED_MODELS_ONLY = {"torchtitan-0.3"}
"""Formats that start from a model the framework ships (torchtitan 0.3's config module): the tiny
preset has none, and its export is a 422 naming why; a Llama-3-8B plan exports."""


@pytest.fixture(scope="module")
def llama_plan(user_token: str, server: Any) -> dict[str, Any]:
    with server.client(user_token) as client:
        r = client.post("/v1/plans", json={"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8,
                                           "training": {"seq_len": 4096, "global_batch": 16}})
        assert r.status_code == 201, r.text
        return r.json()


@pytest.mark.parametrize("fmt", formats())
def test_export_every_format(user: httpx.Client, tiny_plan: dict[str, Any], llama_plan: dict[str, Any], fmt: str) -> None:
    r = user.get(f"/v1/plans/{tiny_plan['id']}/export/{fmt}")
    if fmt in SHIPPED_MODELS_ONLY:
        assert r.status_code == 422 and "has no model of" in r.json()["detail"][0]["msg"], r.text
        r = user.get(f"/v1/plans/{llama_plan['id']}/export/{fmt}")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["format"] == fmt and out["text"].strip() and out["filename"]


RAW_TYPES = {
    "torchrun": "text/x-shellscript", "megatron": "text/x-shellscript", "deepspeed": "application/json",
    "torchtitan": "application/toml", "torchtitan-0.3": "text/x-python", "accelerate": "application/yaml",
}


@pytest.mark.parametrize("fmt", formats())
def test_export_as_a_file_when_accept_asks_for_it(
    user: httpx.Client, tiny_plan: dict[str, Any], llama_plan: dict[str, Any], fmt: str
) -> None:
    plan = llama_plan if fmt in SHIPPED_MODELS_ONLY else tiny_plan
    wrapped = user.get(f"/v1/plans/{plan['id']}/export/{fmt}", headers={"Accept": "application/json"}).json()
    for accept in (RAW_TYPES[fmt], "application/octet-stream", "text/plain", "text/*;q=0.9, application/json;q=0.5"):
        r = user.get(f"/v1/plans/{plan['id']}/export/{fmt}", headers={"Accept": accept})
        assert r.status_code == 200, (accept, r.text)
        if fmt == "deepspeed" and accept == RAW_TYPES[fmt]:
            assert r.json()["text"] == wrapped["text"]  # application/json names the wrapper
            continue
        assert r.headers["content-type"] == f"{RAW_TYPES[fmt]}; charset=utf-8", accept
        assert r.headers["content-disposition"] == f'attachment; filename="{wrapped["filename"]}"'
        assert r.headers["vary"] == "Accept"
        assert r.text == wrapped["text"]
    # no Accept, */* and JSON preferred by q: the wrapper
    for accept in ("*/*", "application/json, text/plain;q=0.5", "application/*"):
        r = user.get(f"/v1/plans/{plan['id']}/export/{fmt}", headers={"Accept": accept})
        assert r.headers["content-type"] == "application/json" and r.json() == wrapped, accept


def test_export_refuses_an_accept_it_cannot_give(user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    r = user.get(f"/v1/plans/{tiny_plan['id']}/export/torchrun", headers={"Accept": "image/png"})
    assert r.status_code == 406
    assert r.json()["detail"][0]["loc"] == ["header", "accept"]


def test_export_unknown_format_names_the_field(user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    r = user.get(f"/v1/plans/{tiny_plan['id']}/export/slurm")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["path", "format"]


def test_impossible_job_is_stored_with_the_closest_miss_in_bytes(user: httpx.Client) -> None:
    body = {"model": "llama3-70b", "cluster": "local-cpu", "gpus": 1, "training": {"seq_len": 4096, "global_batch": 8}}
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    rec = r.json()
    assert rec["feasible"] is False and rec["plan"]["best"] is None and rec["tokens_per_s"] is None
    miss = rec["plan"]["closest_miss"]
    assert miss["over_by_bytes"] == miss["peak_bytes"] - miss["usable_bytes"] > 0
    assert any(f"{miss['over_by_bytes']:,} bytes" in line for line in rec["plan"]["why"])
    exported = user.get(f"/v1/plans/{rec['id']}/export/torchrun")
    assert exported.status_code == 409 and "no layout that fits" in exported.json()["detail"][0]["msg"]
    queued = user.post(f"/v1/plans/{rec['id']}/runs", json={"cluster": "c1"})
    assert queued.status_code == 409


def test_full_fine_tune_beyond_host_ram_is_stored_infeasible_with_the_host_bytes(user: httpx.Client) -> None:
    """A DGX A100 described as the preset with 64 GiB of host memory: Llama-3-70B full fine-tuning
    fits on 8 GPUs only with the optimizer offloaded (1051 GiB per node: Adam states and the float32 gradient partition), which the node cannot hold."""
    cluster = {"preset": "dgx-a100-80g", "host_memory": "64 GiB"}
    body = {"model": "llama3-70b", "cluster": cluster, "gpus": 8, "training": {"seq_len": 4096, "global_batch": 64},
            "constraints": {"framework": "fsdp"}}
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    rec = r.json()
    assert rec["feasible"] is False and rec["plan"]["best"] is None and rec["cluster"] == "dgx-a100-80g-custom"
    assert rec["plan"]["inputs"]["cluster"]["host_memory_bytes"] == 64 * 2**30
    miss = rec["plan"]["closest_miss"]
    assert miss["over_by_bytes"] == miss["peak_bytes"] - miss["usable_bytes"] > 0
    host = [line for line in rec["plan"]["why"] if "host RAM per node" in line]
    assert host and "1051.3 GiB of host RAM per node (8 ranks)" in host[0] and "bytes over the 60.8 GiB usable" in host[0]
    unknown = user.post("/v1/plans", json={**body, "cluster": {"preset": "dgx-z"}})
    assert unknown.status_code == 422 and "unknown cluster preset 'dgx-z'" in unknown.text


def test_idempotency_key_replays_without_duplicating(user: httpx.Client) -> None:
    key = uuid.uuid4().hex
    body = {**PLAN_BODY, "gpus": 1}
    first = user.post("/v1/plans", json=body, headers={"Idempotency-Key": key})
    again = user.post("/v1/plans", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    other = user.post("/v1/plans", json={**body, "gpus": 2}, headers={"Idempotency-Key": key})
    assert other.status_code == 409 and other.json()["detail"][0]["loc"] == ["header", "idempotency-key"]


def test_pinned_constraints_are_honoured(user: httpx.Client) -> None:
    r = user.post("/v1/plans", json={**PLAN_BODY, "constraints": {"pp": 2, "memory_headroom": 0.2}})
    assert r.status_code == 201, r.text
    plan = r.json()["plan"]
    assert plan["best"]["layout"]["pp"] == 2 and plan["inputs"]["constraints"]["memory_headroom"] == 0.2


@pytest.mark.parametrize(
    ("body", "loc", "needle"),
    [
        ({**PLAN_BODY, "model": "gpt-7"}, ["body", "model"], "unknown model 'gpt-7'"),
        ({**PLAN_BODY, "cluster": "moon-base"}, ["body", "cluster"], "unknown cluster 'moon-base'"),
        ({**PLAN_BODY, "gpus": 0}, ["body", "gpus"], "greater than 0"),
        ({**PLAN_BODY, "training": {"seq_len": 128}}, ["body", "training"], "global_batch"),
        ({**PLAN_BODY, "training": {"seq_len": "long", "global_batch": 8}}, ["body", "training", "seq_len"], "integer"),
        ({**PLAN_BODY, "constraints": {"tp": 0}}, ["body", "constraints", "tp"], "greater than or equal to 1"),
        ({**PLAN_BODY, "constraints": {"schedule": "zigzag"}}, ["body", "constraints", "schedule"], "dualpipev"),
        ({**PLAN_BODY, "constraints": {"zero_stage": 3, "max_zero_stage": 1}}, ["body", "constraints"], "exceeds max_zero_stage"),
        ({**PLAN_BODY, "surprise": 1}, ["body", "surprise"], "Extra inputs"),
        ({**PLAN_BODY, "model": {"hidden_size": 64}}, ["body", "model", "vocab_size"], "Field required"),
        ({**PLAN_BODY, "model": {"hf_config": []}}, ["body", "model", "hf_config"], "JSON object"),
        ({**PLAN_BODY, "cluster": {"gpu": "H100-80GB", "gpus_per_node": 0, "intra_node": {"kind": "nvswitch", "bus_bandwidth": "368 GB/s"}}},
         ["body", "cluster", "gpus_per_node"], "greater than 0"),
        ({**PLAN_BODY, "cluster": {"gpu": "no-such-gpu", "gpus_per_node": 8}}, ["body", "cluster", "gpu"], "no-such-gpu"),
        ({**PLAN_BODY, "gpus": 10**9}, ["body", "gpus"], "less than or equal"),
    ],
)
def test_bad_plan_request_names_the_field(user: httpx.Client, body: dict[str, Any], loc: list[Any], needle: str) -> None:
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    hit = [e for e in errors if e["loc"][: len(loc)] == loc]
    assert hit, errors
    assert any(needle in e["msg"] for e in hit), errors


def test_malformed_json_gives_422_with_position(user: httpx.Client) -> None:
    r = user.post("/v1/plans", content=b'{"model": "tiny", ', headers={"content-type": "application/json"})
    assert r.status_code == 422
    err = r.json()["detail"][0]
    assert err["type"] == "json_invalid" and err["loc"][0] == "body" and isinstance(err["loc"][1], int)


def test_huge_body_gives_413(user: httpx.Client, server: Any) -> None:
    big = b'{"model": "' + b"x" * (2 << 20) + b'"}'
    r = user.post("/v1/plans", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["detail"][0]["msg"]

    def chunks():  # no Content-Length: the limit holds for streamed bodies too
        for _ in range(40):
            yield b"x" * 65536

    with server.client(user.headers["Authorization"].split()[1]) as c:
        r = c.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_unknown_plan_is_404(user: httpx.Client) -> None:
    r = user.get("/v1/plans/987654321")
    assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["path", "plan_id"]


def test_evaluate_is_not_stored_unless_asked(user: httpx.Client) -> None:
    job = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "training": {"seq_len": 4096, "global_batch": 16},
           "layout": {"tp": 2}}
    r = user.post("/v1/evaluate", json=job)
    assert r.status_code == 200, r.text
    assert r.json()["id"] is None and r.json()["result"]["ok"] is True
    assert r.json()["result"]["layout"]["tp"] == 2 and r.json()["result"]["layout"]["dp"] == 4
    stored = user.post("/v1/evaluate", params={"store": "true"}, json=job)
    assert stored.status_code == 201 and isinstance(stored.json()["id"], int)
    assert stored.json()["result"] == r.json()["result"]


def test_evaluate_auto_knobs_say_what_they_chose(user: httpx.Client) -> None:
    job = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "training": {"seq_len": 4096, "global_batch": 16},
           "layout": {"tp": 2, "micro_batch": "auto", "recompute": "auto"}}
    r = user.post("/v1/evaluate", json=job)
    assert r.status_code == 200, r.text
    auto = r.json()["result"]["auto"]
    assert auto["knobs"] == ["micro_batch", "recompute"] and auto["fitting"] >= 1
    assert r.json()["result"]["layout"]["micro_batch"] == auto["chosen"]["micro_batch"]
    r = user.post("/v1/evaluate", json={**job, "layout": {"tp": "auto"}})
    assert r.status_code == 422 and "'auto' is supported for" in r.text


def test_evaluate_partition_auto_says_which_cut(user: httpx.Client) -> None:
    job = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 16, "training": {"seq_len": 8192, "global_batch": 32},
           "layout": {"tp": 2, "pp": 2, "vpp": 3}, "partition": "auto"}  # 32 layers over 6 chunks: no default cut
    r = user.post("/v1/evaluate", json=job)
    assert r.status_code == 200, r.text
    cut = r.json()["result"]["auto"]["partition"]
    assert cut["from"] == "cp-sat" and sum(cut["chosen"]) == 32 and len(cut["chosen"]) == 6
    r = user.post("/v1/evaluate", json={**job, "partition": "even"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] == ["body", "partition"]


def test_evaluate_bad_layout_names_the_field(user: httpx.Client) -> None:
    job = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "training": {"seq_len": 4096, "global_batch": 16},
           "layout": {"tp": 3}}
    r = user.post("/v1/evaluate", json=job)
    assert r.status_code == 422
    errs = r.json()["detail"]
    assert errs[0]["loc"][:2] == ["body", "layout"] and "does not divide the 8 GPUs" in errs[0]["msg"]
    r = user.post("/v1/evaluate", json={**job, "layout": {"tp": 2}, "partition": [1, 2, 3]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "partition"]
    r = user.post("/v1/evaluate", json={**job, "model": "../../etc/passwd"})
    assert r.status_code == 422 and "unknown model" in r.json()["detail"][0]["msg"]


def test_nul_bytes_surrogates_and_nan_are_refused_with_their_path(user: httpx.Client) -> None:
    """Values no database column holds faithfully get 422 with their path, on SQLite and PostgreSQL
    alike (PostgreSQL refuses NUL in text; NaN is not JSON)."""
    job = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "training": {"seq_len": 4096, "global_batch": 16}}
    r = user.post("/v1/evaluate", json={**job, "model": "llama\x003-8b"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model"], r.text
    body = '{"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8, "training": {"seq_len": 4096, "global_batch": 16, "x": "\\ud800"}}'
    r = user.post("/v1/evaluate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "training", "x"], r.text
    r = user.post("/v1/evaluate", content=body.replace('"\\ud800"', "NaN"), headers={"content-type": "application/json"})
    assert r.status_code == 422 and "NaN" in r.json()["detail"][0]["msg"], r.text


def test_idempotency_keys_are_per_token(server: Any, user: httpx.Client) -> None:
    """Another token replaying my key gets a plan of its own, never mine (issue 12, finding 8)."""
    key = uuid.uuid4().hex
    body = {**PLAN_BODY, "gpus": 1}
    mine = user.post("/v1/plans", json=body, headers={"Idempotency-Key": key})
    assert mine.status_code == 201, mine.text
    with server.client(server.token("user")) as other:
        theirs = other.post("/v1/plans", json=body, headers={"Idempotency-Key": key})
        assert theirs.status_code == 201 and theirs.json()["id"] != mine.json()["id"], theirs.text
        # and the key is theirs now: a replay by them finds their plan, a different body conflicts
        assert other.post("/v1/plans", json=body, headers={"Idempotency-Key": key}).json()["id"] == theirs.json()["id"]
        assert other.post("/v1/plans", json={**body, "gpus": 2}, headers={"Idempotency-Key": key}).status_code == 409
    assert user.post("/v1/plans", json=body, headers={"Idempotency-Key": key}).json()["id"] == mine.json()["id"]


TINY_FIELDS_LOC = ["body", "model", "num_layers"]


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        ("/v1/plans", {**PLAN_BODY, "gpus": True}, ["body", "gpus"]),
        ("/v1/plans", {**PLAN_BODY, "training": {"seq_len": 128, "global_batch": True}}, ["body", "training", "global_batch"]),
        ("/v1/plans", {**PLAN_BODY, "constraints": {"tp": True}}, ["body", "constraints", "tp"]),
        ("/v1/plans", {**PLAN_BODY, "constraints": {"memory_headroom": False}}, ["body", "constraints", "memory_headroom"]),
        ("/v1/evaluate", {**PLAN_BODY, "layout": {"tp": True}}, ["body", "layout", "tp"]),
        ("/v1/evaluate", {**PLAN_BODY, "gpus": False}, ["body", "gpus"]),
        ("/v1/plans", {**PLAN_BODY, "cluster": {"preset": "local-cpu", "gpus_per_node": True}}, ["body", "cluster", "gpus_per_node"]),
        ("/v1/clusters", {"name": "c-bool", "spec": {"preset": "local-cpu", "gpus_per_node": True}}, ["body", "spec", "gpus_per_node"]),
    ],
)
def test_booleans_are_never_numbers(user: httpx.Client, path: str, body: dict[str, Any], loc: list[Any]) -> None:
    """`true` where a number belongs is refused with its path, not read as 1 (issue 12, finding 8)."""
    r = user.post(path, json=body)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == loc and err["type"] == "bool_is_not_a_number" and "boolean" in err["msg"], err


def test_an_anonymous_body_is_refused_before_its_numbers_are_checked(anon: httpx.Client) -> None:
    """401 for a request without a token, whatever its body holds: the schema check would tell an
    anonymous caller what the body should look like."""
    for path, body in (("/v1/plans", {**PLAN_BODY, "gpus": True}), ("/v1/clusters", {"name": "x", "spec": {"gpus_per_node": True}})):
        r = anon.post(path, json=body)
        assert r.status_code == 401, r.text


def test_booleans_are_never_numbers_in_inline_and_team_models(user: httpx.Client) -> None:
    spec = user.get("/v1/models/tiny").json()["spec"]
    r = user.post("/v1/plans", json={**PLAN_BODY, "model": {**spec, "num_layers": True}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == TINY_FIELDS_LOC, r.text
    r = user.post("/v1/models", json={"name": f"m-{uuid.uuid4().hex[:8]}", "spec": {**spec, "num_layers": True}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "spec", "num_layers"], r.text


def test_booleans_stay_booleans_where_the_schema_wants_one(user: httpx.Client) -> None:
    r = user.post("/v1/evaluate", json={**PLAN_BODY, "layout": {"offload_optimizer": False}})
    assert r.status_code == 200, r.text
    r = user.post("/v1/plans", json={**PLAN_BODY, "constraints": {"allow_offload": False}})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("path", "params"),
    [("/v1/runs", {"cluster": "a\x00b"}), ("/v1/plans", {"model": "tiny\x00"}), ("/v1/plans", {"cluster": "\x00"})],
)
def test_nul_in_a_query_parameter_is_refused_with_its_name(user: httpx.Client, path: str, params: dict[str, str]) -> None:
    """PostgreSQL answered 500 to a NUL in a list filter (issue 12, finding 7): refused on every backend."""
    r = user.get(path, params=params)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", next(iter(params))] and "NUL" in r.json()["detail"][0]["msg"]


def test_a_lora_plan_is_planned_in_its_stack_listed_with_its_method_and_exported_as_the_stacks_file(
    user: httpx.Client,
) -> None:
    """The service plans a fine-tuning job as the CLI does (`planner.finetune.search_finetune`): in the
    stack that runs its method, with the stack's techniques searched; the list shows the method from
    its own column (never the plan JSON); the plan exports as the stack's file, and a plan priced
    outside any stack is refused that format with the reason."""
    body = {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 1,
            "training": {"seq_len": 2048, "global_batch": 8, "method": "lora"}}
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    plan = r.json()
    layout = plan["plan"]["best"]["layout"]
    assert layout["stack"] == "hf" and layout["framework"] == "fsdp", layout
    assert any(line.startswith("stack hf") for line in plan["plan"]["why"]), plan["plan"]["why"][:3]
    listed = user.get("/v1/plans", params={"model": "llama3-8b", "limit": 200}).json()["items"]
    assert {p["id"]: p["method"] for p in listed}[plan["id"]] == "lora"
    exported = user.get(f"/v1/plans/{plan['id']}/export/hf")
    assert exported.status_code == 200, exported.text
    assert "lora_config:" in exported.json()["text"], exported.json()["text"]
