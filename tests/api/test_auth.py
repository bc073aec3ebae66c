"""Tokens: unauthenticated writes refused, revocation, roles, agent tokens bound to their cluster,
and the `autopar tokens` commands."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

PLAN = {"model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8}}

WRITES = [
    ("POST", "/v1/plans", PLAN),
    ("POST", "/v1/evaluate", {**PLAN, "layout": {}}),
    ("POST", "/v1/models", {"name": "m", "spec": {}}),
    ("POST", "/v1/clusters", {"name": "c", "spec": {}}),
    ("POST", "/v1/plans/1/runs", {"cluster": "c"}),
    ("POST", "/v1/runs/1/cancel", None),
    ("POST", "/v1/agents", {"name": "a", "cluster": "c", "hostname": "h"}),
    ("POST", "/v1/runs/lease", {"agent_id": 1}),
    ("POST", "/v1/runs/1/heartbeat", {"agent_id": 1, "attempt": 1}),
    ("PUT", "/v1/runs/1/profile", {}),
    ("POST", "/v1/runs/1/finish", {"agent_id": 1, "attempt": 1, "status": "failed"}),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
@pytest.mark.parametrize("header", [None, "Bearer apt_not-a-real-token", "Basic dXNlcjpwYXNz"])
def test_writes_without_a_valid_token_are_refused(
    anon: httpx.Client, method: str, path: str, body: Any, header: str | None
) -> None:
    headers = {"Authorization": header} if header else {}
    r = anon.request(method, path, json=body, headers=headers)
    assert r.status_code in (401, 403), r.text
    if r.status_code == 401:
        assert r.headers["www-authenticate"] == "Bearer"


def test_reads_of_runs_need_a_token(anon: httpx.Client) -> None:
    assert anon.get("/v1/runs").status_code == 401
    assert anon.get("/v1/plans").status_code == 200  # plans and presets are readable by anyone


def test_revoked_token_stops_working(server: Any) -> None:
    token = server.token("user")
    with server.client(token) as c:
        assert c.post("/v1/evaluate", json={**PLAN, "layout": {}}).status_code == 200
        server.revoke(token)
        r = c.post("/v1/evaluate", json={**PLAN, "layout": {}})
        assert r.status_code == 401 and "revoked" in r.json()["detail"][0]["msg"]


def test_roles(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    agent_token = server.token("agent", "role-site")
    with server.client(agent_token) as agent:
        r = agent.post("/v1/plans", json=PLAN)
        assert r.status_code == 403 and "user token" in r.json()["detail"][0]["msg"]
        assert agent.post(f"/v1/plans/{tiny_plan['id']}/runs", json={"cluster": "role-site"}).status_code == 403
    r = user.post("/v1/runs/lease", json={"agent_id": 1})
    assert r.status_code == 403 and "agent token" in r.json()["detail"][0]["msg"]


def test_agent_token_is_bound_to_its_cluster(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    east, west = server.token("agent", "east"), server.token("agent", "west")
    run_east = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json={"cluster": "east"}).json()
    with server.client(east) as e, server.client(west) as w:
        assert w.post("/v1/agents", json={"name": "w", "cluster": "east", "hostname": "h"}).status_code == 403
        east_agent = e.post("/v1/agents", json={"name": "e", "cluster": "east", "hostname": "h"}).json()["id"]
        west_agent = w.post("/v1/agents", json={"name": "w", "cluster": "west", "hostname": "h"}).json()["id"]
        # west cannot lease with east's agent, nor see or touch east's runs
        assert w.post("/v1/runs/lease", json={"agent_id": east_agent}).status_code == 403
        assert w.post("/v1/runs/lease", json={"agent_id": west_agent}).status_code in (200, 204)
        assert w.get(f"/v1/runs/{run_east['id']}").status_code == 403
        assert w.get("/v1/runs", params={"cluster": "east"}).status_code == 403
        assert all(r["cluster"] == "west" for r in w.get("/v1/runs").json()["items"])
        lease = e.post("/v1/runs/lease", json={"agent_id": east_agent})
        assert lease.status_code == 200 and lease.json()["run"]["cluster"] == "east"
        run_id = lease.json()["run"]["id"]
        hb = {"agent_id": west_agent, "attempt": 1}
        assert w.post(f"/v1/runs/{run_id}/heartbeat", json=hb).status_code == 403
        assert w.put(f"/v1/runs/{run_id}/profile", json={"step_s": 1.0},
                     params={"agent_id": west_agent, "attempt": 1}).status_code == 403
        assert w.post(f"/v1/runs/{run_id}/finish", json={**hb, "status": "failed"}).status_code == 403
        assert e.get(f"/v1/runs/{run_id}").json()["status"] == "leased"  # untouched


def test_tokens_cli_create_list_revoke(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    cli = [sys.executable, "-m", "autopar.cli", "tokens"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args, "--database-url", url], capture_output=True, text=True, timeout=60)

    created = run("create", "--name", "ci-agent", "--role", "agent", "--cluster", "east")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("apt_") and len(secret) > 40
    listed = run("list")
    assert "ci-agent" in listed.stdout and "east" in listed.stdout and secret not in listed.stdout
    assert secret[:10] in listed.stdout
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM api_tokens")).scalar_one()
    engine.dispose()
    import hashlib

    assert stored == hashlib.sha256(secret.encode()).hexdigest()  # only the digest is kept
    assert run("revoke", "1").returncode == 0
    revoked_line = run("list").stdout.splitlines()[1]
    assert revoked_line.count(":") == 4  # created and revoked timestamps (was "-" before)
    bad = run("create", "--name", "x", "--role", "agent")
    assert bad.returncode == 2 and "--cluster" in bad.stderr
