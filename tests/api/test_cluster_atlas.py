"""A team cluster's measured kernel profile: stored through the API (PUT / GET
/v1/clusters/{name}/atlas, migration 0006), refused by field when malformed, and used by the plans
made for that cluster, which say so (`kernel_profile`, a `why` sentence)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from tests.api.conftest import unique

PLAN = {"model": "tiny", "gpus": 1, "training": {"seq_len": 128, "global_batch": 8}}


def cpu_profile() -> dict[str, Any]:
    """A profile of the catalog's cpu device at shapes the tiny plan looks up (GEMMs of its 1,024-row
    micro-batch), timed much slower than its datasheet prices them, so the plan moves visibly."""
    gemm = [{"m": 1024, "n": n, "k": 128, "dtype": "bf16", "seconds": 1e-3 * n / 128, "source": "p"}
            for n in (128, 384, 512, 768)]
    return {
        "format": "autopar-kernel-atlas/1", "gpu": "cpu",
        "provenance": {"device": "cpu (x86_64, 1 threads)", "measured_at": "2026-11-28T08:00:00+00:00",
                       "command": "autopar profile plan.json", "software": "torch 2.13.0+cpu"},
        "sources": {"p": {"citation": "autopar profile on the test's CPU", "method": "queued"}},
        "gemm": gemm,
        "memory": [{"op": "copy", "gb_per_s": 5.0, "source": "p"}],
    }


@pytest.fixture()
def team_cpu(user: httpx.Client) -> str:
    name = unique("lab-cpu")
    r = user.post("/v1/clusters", json={"name": name, "spec": {"preset": "local-cpu"}})
    assert r.status_code == 201, r.text
    return name


def test_a_stored_profile_prices_the_clusters_plans_and_they_say_so(user: httpx.Client, team_cpu: str) -> None:
    before = user.post("/v1/plans", json={**PLAN, "cluster": team_cpu})
    assert before.status_code == 201, before.text
    assert "kernel_profile" not in before.json()["plan"]  # priced with the shipped atlas alone
    assert user.get(f"/v1/clusters/{team_cpu}/atlas").status_code == 404

    put = user.put(f"/v1/clusters/{team_cpu}/atlas", json=cpu_profile())
    assert put.status_code == 200, put.text
    stored = put.json()
    assert (stored["gpu"], stored["points"], stored["device"]) == ("cpu", 5, "cpu (x86_64, 1 threads)")
    assert user.get(f"/v1/clusters/{team_cpu}/atlas").json()["digest"] == stored["digest"]

    after = user.post("/v1/plans", json={**PLAN, "cluster": team_cpu})
    assert after.status_code == 201, after.text
    plan = after.json()["plan"]
    note = plan["kernel_profile"]
    assert note["digest"] == stored["digest"] and note["device"] == "cpu (x86_64, 1 threads)"
    assert note["measured_at"] == "2026-11-28T08:00:00+00:00"
    assert 0 < note["from_profile"] <= note["needed"]
    assert any(e.startswith("gemm 1024x") for e in note["entries"])
    assert any("this cluster's profile" in line for line in plan["why"])
    # the profile times those GEMMs far slower than the datasheet: the plan's step is slower
    assert plan["best"]["estimate"]["step_s"] > before.json()["plan"]["best"]["estimate"]["step_s"]
    # an evaluation of the chosen layout on that cluster is priced with it too, and says so
    job = {"model": "tiny", "cluster": team_cpu, "gpus": 1, "training": PLAN["training"],
           "layout": plan["best"]["layout"]}
    evaluated = user.post("/v1/evaluate", json=job)
    assert evaluated.status_code == 200, evaluated.text
    assert evaluated.json()["result"]["kernel_profile"]["digest"] == stored["digest"]
    assert evaluated.json()["result"]["step_s"] == pytest.approx(plan["best"]["estimate"]["step_s"], rel=1e-9)
    # a preset named in a request is never priced with a team's profile
    preset = user.post("/v1/plans", json={**PLAN, "cluster": "local-cpu"})
    assert "kernel_profile" not in preset.json()["plan"]


@pytest.mark.parametrize(("edit", "loc"), [
    (lambda d: d.update(format="autopar-kernel-atlas/9"), ["body", "format"]),
    (lambda d: d["gemm"][1].update(m=0), ["body", "gemm", 1, "m"]),
    (lambda d: d["gemm"][0].pop("seconds"), ["body", "gemm", 0]),
    (lambda d: d.update(gpu="H100-80GB"), ["body", "gpu"]),
    (lambda d: d.update(gpu="no-such-gpu"), ["body", "gpu"]),
    (lambda d: d.pop("provenance"), ["body", "provenance"]),
    (lambda d: d.update(surplus=1), ["body", "surplus"]),
])
def test_a_bad_profile_is_a_422_naming_the_field_and_nothing_is_stored(
    user: httpx.Client, team_cpu: str, edit: Any, loc: list[Any],
) -> None:
    doc = copy.deepcopy(cpu_profile())
    edit(doc)
    r = user.put(f"/v1/clusters/{team_cpu}/atlas", json=doc)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc
    assert user.get(f"/v1/clusters/{team_cpu}/atlas").status_code == 404


def test_a_bad_upload_leaves_the_stored_profile_whole(user: httpx.Client, team_cpu: str) -> None:
    first = user.put(f"/v1/clusters/{team_cpu}/atlas", json=cpu_profile()).json()
    bad = cpu_profile()
    bad["gemm"][0]["source"] = "elsewhere"
    assert user.put(f"/v1/clusters/{team_cpu}/atlas", json=bad).status_code == 422
    assert user.get(f"/v1/clusters/{team_cpu}/atlas").json()["digest"] == first["digest"]


def test_who_may_store_a_profile(server: Any, user: httpx.Client, team_cpu: str) -> None:
    assert user.put("/v1/clusters/local-cpu/atlas", json=cpu_profile()).status_code == 409
    assert user.put(f"/v1/clusters/{unique('nowhere')}/atlas", json=cpu_profile()).status_code == 404
    with server.client(server.token("agent", cluster=unique("other"))) as other:
        assert other.put(f"/v1/clusters/{team_cpu}/atlas", json=cpu_profile()).status_code == 403
    with server.client(server.token("agent", cluster=team_cpu)) as own:
        assert own.put(f"/v1/clusters/{team_cpu}/atlas", json=cpu_profile()).status_code == 200
    with server.client() as anon:
        assert anon.get(f"/v1/clusters/{team_cpu}/atlas").status_code == 401
