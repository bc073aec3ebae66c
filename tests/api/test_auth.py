"""Tokens: unauthenticated writes refused, revocation, roles, agent tokens bound to their cluster,
and the `autopar tokens` commands."""

from __future__ import annotations

import subprocess
import sys
import uuid
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


def test_an_agent_token_for_a_preset_is_created_with_a_notice_that_it_will_not_calibrate(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    def create(cluster: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "autopar.cli", "tokens", "create", "--name", f"agent-{cluster}", "--role", "agent",
             "--cluster", cluster, "--database-url", url], capture_output=True, text=True, timeout=60,
        )

    for preset in ("local-cpu", "DGX_H100"):  # any spelling the presets resolve
        made = create(preset)
        assert made.returncode == 0, made.stderr
        assert made.stdout.strip().startswith("apt_") and "notice" not in made.stdout  # stdout: the token alone
        assert f"notice: {preset!r} is a cluster preset" in made.stderr
        assert "profiles never calibrate a preset" in made.stderr and "POST /v1/clusters" in made.stderr
    own = create("lab-cpu")
    assert own.returncode == 0 and "notice" not in own.stderr, own.stderr


def test_agent_ids_are_bound_to_the_token_that_registered_them(
    server: Any, user: httpx.Client, tiny_plan: dict[str, Any]
) -> None:
    """Two agent tokens of one cluster: neither may lease, heartbeat, upload or finish as an agent
    the other registered (issue 12, finding 8)."""
    cluster = f"bound-{uuid.uuid4().hex[:8]}"
    mine, theirs = server.token("agent", cluster), server.token("agent", cluster)
    run = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json={"cluster": cluster}).json()
    with server.client(mine) as m, server.client(theirs) as t:
        my_agent = m.post("/v1/agents", json={"name": "m", "cluster": cluster, "hostname": "h"}).json()["id"]
        their_agent = t.post("/v1/agents", json={"name": "t", "cluster": cluster, "hostname": "h"}).json()["id"]
        r = t.post("/v1/runs/lease", json={"agent_id": my_agent})
        assert r.status_code == 403, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "agent_id"] and "another token" in r.json()["detail"][0]["msg"]
        lease = m.post("/v1/runs/lease", json={"agent_id": my_agent})
        assert lease.status_code == 200 and lease.json()["run"]["id"] == run["id"], lease.text
        as_mine = {"agent_id": my_agent, "attempt": 1}
        assert t.post(f"/v1/runs/{run['id']}/heartbeat", json=as_mine).status_code == 403
        assert t.put(f"/v1/runs/{run['id']}/profile", json={"step_s": 1.0}, params=as_mine).status_code == 403
        assert t.post(f"/v1/runs/{run['id']}/finish", json={**as_mine, "status": "failed"}).status_code == 403
        # under its own agent id the other token is simply not the lease holder
        as_theirs = {"agent_id": their_agent, "attempt": 1}
        assert t.post(f"/v1/runs/{run['id']}/heartbeat", json=as_theirs).status_code == 409
        assert m.get(f"/v1/runs/{run['id']}").json()["status"] == "leased"  # untouched
        assert m.post(f"/v1/runs/{run['id']}/heartbeat", json=as_mine).status_code == 200


def test_only_the_creator_or_an_admin_cancels_a_run(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    cluster = f"own-{uuid.uuid4().hex[:8]}"
    queue = {"cluster": cluster}
    with server.client(server.token("user")) as other, server.client(server.token("admin")) as admin:
        run = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json=queue).json()
        r = other.post(f"/v1/runs/{run['id']}/cancel")
        assert r.status_code == 403, r.text
        assert r.json()["detail"][0]["loc"] == ["path", "run_id"] and "another token" in r.json()["detail"][0]["msg"]
        assert user.get(f"/v1/runs/{run['id']}").json()["status"] == "queued"  # untouched
        assert user.post(f"/v1/runs/{run['id']}/cancel").json()["status"] == "cancelled"  # its creator may
        second = other.post(f"/v1/plans/{tiny_plan['id']}/runs", json=queue).json()
        r = admin.post(f"/v1/runs/{second['id']}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text  # an admin may cancel any run
        assert admin.post("/v1/evaluate", json={**PLAN, "layout": {}}).status_code == 200  # and is a user


def test_admin_role_in_the_tokens_cli(tmp_path: Any) -> None:
    url_file = tmp_path / "db-url"
    url_file.write_text(f"sqlite:///{tmp_path / 'cli.db'}\n")
    url_file.chmod(0o600)
    created = subprocess.run(
        [sys.executable, "-m", "autopar.cli", "tokens", "create", "--name", "ops", "--role", "admin",
         "--database-url-file", str(url_file)], capture_output=True, text=True, timeout=60,
    )
    assert created.returncode == 0 and created.stdout.strip().startswith("apt_"), created.stderr
    assert "warning" not in created.stderr
    assert (tmp_path / "cli.db").exists()  # the URL came from the file


def test_a_database_password_on_the_command_line_is_warned_about(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    from autopar.cli_secrets import database_url

    assert database_url("sqlite:///x.db", None) == "sqlite:///x.db"
    assert "warning" not in capsys.readouterr().err
    assert database_url("postgresql+psycopg://autopar:s3cret@db/autopar", None)
    assert "--database-url puts the database password on the command line" in capsys.readouterr().err
    secret_file = tmp_path / "url"
    secret_file.write_text("postgresql+psycopg://autopar:s3cret@db/autopar\n")
    secret_file.chmod(0o644)
    assert database_url(None, secret_file) == "postgresql+psycopg://autopar:s3cret@db/autopar"
    assert "readable by other users" in capsys.readouterr().err
