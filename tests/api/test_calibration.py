"""Calibration from profiles (api/calibration.py, GET /v1/clusters/{name}/calibration): a team
cluster's profiles refit it; a cluster preset is never refitted, whatever profiles runs on its name
upload, and no team cluster may take a preset's name."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

SHAPES = [(512, 32), (1024, 32), (2048, 32)]
"""Tiny-model shapes whose compute outweighs the global fixed cost per step, so that profiles at
twice the prediction identify the compute scale (tests/agent/test_end_to_end.py uses the same)."""
SLOW = 2.0


def _body(cluster: str | dict[str, Any], seq_len: int, global_batch: int) -> dict[str, Any]:
    return {"model": "tiny", "cluster": cluster, "gpus": 2, "training": {"seq_len": seq_len, "global_batch": global_batch}}


def _plan(user: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = user.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _evaluate(user: httpx.Client, body: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    r = user.post("/v1/evaluate", json={**body, "layout": layout})
    assert r.status_code == 200, r.text
    return dict(r.json()["result"])


def _profile_runs(server: Any, user: httpx.Client, run_cluster: str, plans: list[dict[str, Any]]) -> None:
    """Queue each plan on `run_cluster` and, as that cluster's agent, upload a profile measuring
    `SLOW` x the predicted step time."""
    with server.client(server.token("agent", run_cluster)) as agent:
        r = agent.post("/v1/agents", json={"name": "calibrator", "cluster": run_cluster, "hostname": "node-0"})
        assert r.status_code == 201, r.text
        agent_id = r.json()["id"]
        for p in plans:
            run = user.post(f"/v1/plans/{p['id']}/runs", json={"cluster": run_cluster, "steps": 5})
            assert run.status_code == 201, run.text
            lease = agent.post("/v1/runs/lease", json={"agent_id": agent_id})
            assert lease.status_code == 200, lease.text
            assert lease.json()["run"]["id"] == run.json()["id"]
            attempt = lease.json()["attempt"]
            step_s = SLOW * p["step_s"]
            prof = {"step_s": step_s, "step_times_s": [step_s] * 5, "tokens_per_s": 1.0 / step_s}
            put = agent.put(f"/v1/runs/{run.json()['id']}/profile", json=prof,
                            params={"agent_id": agent_id, "attempt": attempt})
            assert put.status_code == 201, put.text
            fin = agent.post(f"/v1/runs/{run.json()['id']}/finish", json={
                "agent_id": agent_id, "attempt": attempt, "status": "succeeded", "log_tail": "", "exit_code": 0,
            })
            assert fin.status_code == 200, fin.text


def _pricing(user: httpx.Client, body: dict[str, Any], layout: dict[str, Any]) -> tuple[Any, ...]:
    """What a plan and an evaluation of `body` say: the plan's step time, calibration and best
    estimate, and the whole evaluation of `layout`."""
    plan = _plan(user, body)
    return plan["step_s"], plan["calibration"], plan["plan"]["best"]["estimate"], _evaluate(user, body, layout)


@pytest.mark.parametrize(
    ("cluster", "run_cluster"),
    [
        ("local-cpu", "local-cpu"),
        # an inline spec named like the preset in another spelling: the name still means the preset
        ({"preset": "local-cpu", "name": "LOCAL_cpu"}, "LOCAL_cpu"),
    ],
    ids=["preset", "preset-spelled-otherwise"],
)
def test_profiles_on_a_preset_leave_its_pricing_unchanged(
    server: Any, user: httpx.Client, cluster: str | dict[str, Any], run_cluster: str
) -> None:
    probe = _body(cluster, 512, 128)
    layout = _plan(user, probe)["plan"]["best"]["layout"]
    before = _pricing(user, probe, layout)
    assert before[1].startswith("fitted by bench/fit_calibration.py")

    plans = [_plan(user, _body(cluster, s, b)) for s, b in SHAPES]
    _profile_runs(server, user, run_cluster, plans)
    # the profiles are stored and readable beside their plans ...
    for p in plans:
        items = user.get(f"/v1/plans/{p['id']}/profiles").json()["items"]
        assert [x["measured"]["step_s"] for x in items] == [pytest.approx(SLOW * p["step_s"])]
    # ... but a plan and an evaluation for the preset are priced exactly as before
    assert _pricing(user, probe, layout) == before

    r = user.get(f"/v1/clusters/{run_cluster}/calibration")
    assert r.status_code == 200, r.text
    cal = r.json()
    assert cal["preset"] is True and cal["n_profiles"] == 0 and cal["profiles_stored"] >= 3
    assert cal["source"] == before[1] and cal["time_multipliers"] == {"compute": 1.0, "intra": 1.0, "inter": 1.0}
    assert cal["error_before"] is None and cal["error_after"] is None
    assert "cluster preset" in cal["note"] and "published runs" in cal["note"] and "POST /v1/clusters" in cal["note"]
    assert all("cluster preset" in f["reason"] and not f["identified"] for f in cal["factors"])


def test_a_team_clusters_profiles_refit_it(server: Any, user: httpx.Client) -> None:
    name = f"lab-{uuid.uuid4().hex[:8]}"
    r = user.post("/v1/clusters", json={"name": name, "spec": {"preset": "local-cpu"}})
    assert r.status_code == 201, r.text
    probe = _body(name, 512, 128)
    layout = _plan(user, probe)["plan"]["best"]["layout"]
    before = _pricing(user, probe, layout)
    preset_before = _pricing(user, _body("local-cpu", 512, 128), layout)
    assert before[0] == preset_before[0]  # same spec, no profiles yet: same price

    plans = [_plan(user, _body(name, s, b)) for s, b in SHAPES]
    _profile_runs(server, user, name, plans)

    cal = user.get(f"/v1/clusters/{name}/calibration").json()
    assert cal["preset"] is False and cal["note"] is None
    assert cal["n_profiles"] == 3 and cal["profiles_stored"] == 3
    assert cal["source"].startswith(f"cluster {name}: fitted from 3 profiles")
    assert cal["time_multipliers"]["compute"] == pytest.approx(SLOW, rel=0.1)
    after = _pricing(user, probe, layout)
    assert after[1] == cal["source"]
    assert after[0] == pytest.approx(SLOW * before[0], rel=0.1)
    assert after[3]["step_s"] == pytest.approx(after[0], rel=1e-6)  # the evaluation too
    assert _pricing(user, _body("local-cpu", 512, 128), layout) == preset_before  # the preset is untouched


def test_a_plan_priced_for_another_spec_under_a_team_clusters_name_does_not_move_its_fit(
    server: Any, user: httpx.Client
) -> None:
    """An inline cluster spec may take any name: profiles of plans priced for a different machine
    under a registered cluster's name stay stored but do not calibrate that cluster."""
    name = f"lab-{uuid.uuid4().hex[:8]}"
    r = user.post("/v1/clusters", json={"name": name, "spec": {"preset": "local-cpu"}})
    assert r.status_code == 201, r.text
    impostor = {"preset": "local-cpu", "name": name, "host_memory": "8 GiB"}
    plans = [_plan(user, _body(impostor, s, b)) for s, b in SHAPES]
    assert all(p["plan"]["inputs"]["cluster"]["name"] == name for p in plans)
    _profile_runs(server, user, name, plans)
    cal = user.get(f"/v1/clusters/{name}/calibration").json()
    assert cal["profiles_stored"] == 3 and cal["n_profiles"] == 0
    assert cal["time_multipliers"] == {"compute": 1.0, "intra": 1.0, "inter": 1.0}


def test_registering_a_name_later_refits_without_the_other_specs_profiles(server: Any, user: httpx.Client) -> None:
    """A fit served before the name is registered is not reused after it: which profiles count
    depends on the registered spec (`api.calibration.cluster_fit` versions its cache with it)."""
    name = f"lab-{uuid.uuid4().hex[:8]}"
    inline = {"preset": "local-cpu", "name": name, "host_memory": "8 GiB"}
    _profile_runs(server, user, name, [_plan(user, _body(inline, s, b)) for s, b in SHAPES])
    assert user.get(f"/v1/clusters/{name}/calibration").json()["n_profiles"] == 3  # unregistered: all count
    r = user.post("/v1/clusters", json={"name": name, "spec": {"preset": "local-cpu"}})
    assert r.status_code == 201, r.text
    cal = user.get(f"/v1/clusters/{name}/calibration").json()
    assert cal["profiles_stored"] == 3 and cal["n_profiles"] == 0


@pytest.mark.parametrize("name", ["dgx-h100", "DGX_H100", "Local-CPU"])
def test_a_team_cluster_may_not_take_a_presets_name(user: httpx.Client, name: str) -> None:
    r = user.post("/v1/clusters", json={"name": name, "spec": {"preset": "local-cpu"}})
    assert r.status_code == 409, r.text
    [err] = r.json()["detail"]
    assert err["loc"] == ["body", "name"] and err["type"] == "conflict"
    assert f"{name!r} is a cluster preset's name" in err["msg"]
    assert "never calibrated from profiles" in err["msg"] and "pick a name of your own" in err["msg"]
    team = user.get("/v1/clusters", params={"source": "team", "limit": 200}).json()["items"]
    assert name not in {c["name"] for c in team}
