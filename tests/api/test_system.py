"""Health, Prometheus metrics, team specs, presets, and the CLI's lazy imports."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from model_specs.presets import list_models


def test_healthz(anon: httpx.Client) -> None:
    from alembic.script import ScriptDirectory

    from api.db import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    r = anon.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["migration"] == head


def test_metrics_are_prometheus_text(anon: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    r = anon.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'autopar_http_requests_total{method="POST",route="/v1/plans",status="201"}' in text
    assert "autopar_planner_search_seconds_count" in text and 'autopar_plans_created_total{feasible="true"}' in text
    assert "/v1/plans/{plan_id}" in text or "autopar_runs" in text


def test_made_up_methods_do_not_grow_the_metrics(anon: httpx.Client) -> None:
    """Labels come from closed sets: 200 requests with invented methods and paths add one series."""
    for i in range(200):
        anon.request(f"X{uuid.uuid4().hex[:8].upper()}", f"/nowhere/{i}")
    size = len(anon.get("/metrics").text)
    for i in range(200):
        anon.request(f"Y{uuid.uuid4().hex[:8].upper()}", f"/elsewhere/{i}")
    text = anon.get("/metrics").text
    assert 'method="other"' in text and not re.search(r'method="[XY][0-9A-F]{8}"', text)
    assert len(text) < size + 2000  # counters move, no new series


def test_presets_are_listed_and_paginated(anon: httpx.Client) -> None:
    page = anon.get("/v1/models", params={"source": "preset", "limit": 200}).json()
    assert page["total"] == len(list_models()) == len(page["items"])
    tiny = next(m for m in page["items"] if m["name"] == "tiny")
    assert tiny["params_total"] > 0 and tiny["spec"]["num_layers"] > 0
    two = anon.get("/v1/models", params={"source": "preset", "limit": 2, "offset": 1}).json()["items"]
    assert [m["name"] for m in two] == [m["name"] for m in page["items"][1:3]]
    clusters = anon.get("/v1/clusters", params={"source": "preset"}).json()
    assert "dgx-h100" in {c["name"] for c in clusters["items"]}
    gpus = anon.get("/v1/gpus", params={"limit": 200}).json()
    assert gpus["total"] == len(gpus["items"]) > 0 and all(g["memory_bytes"] > 0 for g in gpus["items"])


def test_team_specs_are_stored_and_usable_by_name(user: httpx.Client) -> None:
    model_name, cluster_name = f"team-{uuid.uuid4().hex[:8]}", f"lab-{uuid.uuid4().hex[:8]}"
    spec = {"vocab_size": 1024, "hidden_size": 128, "num_layers": 4, "num_heads": 4, "ffn_hidden_size": 512}
    r = user.post("/v1/models", json={"name": model_name, "spec": spec})
    assert r.status_code == 201, r.text
    assert r.json()["source"] == "team" and r.json()["spec"]["name"] == model_name
    assert user.post("/v1/models", json={"name": model_name, "spec": spec}).status_code == 409
    assert user.post("/v1/models", json={"name": "tiny", "spec": spec}).status_code == 409  # no shadowing presets
    cluster = {"gpu": "H100-80GB", "gpus_per_node": 8,
               "intra_node": {"kind": "nvswitch", "bus_bandwidth": "360 GB/s"},
               "inter_node": {"nics_per_node": 8, "nic_bandwidth": "400 Gb/s"}}
    r = user.post("/v1/clusters", json={"name": cluster_name, "spec": cluster})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["inter_node"]["nic_bandwidth_bytes_per_s"] == 400e9 / 8
    assert user.get(f"/v1/models/{model_name}").json()["source"] == "team"
    assert user.get(f"/v1/clusters/{cluster_name}").json()["gpus_per_node"] == 8

    body = {"model": model_name, "cluster": cluster_name, "gpus": 8, "training": {"seq_len": 256, "global_batch": 16}}
    plan = user.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    assert plan.json()["model"] == model_name and plan.json()["cluster"] == cluster_name and plan.json()["feasible"]
    ev = user.post("/v1/evaluate", json={**body, "layout": {"tp": 2}})
    assert ev.status_code == 200 and ev.json()["result"]["cluster"] == cluster_name
    listed = user.get("/v1/plans", params={"model": model_name}).json()
    assert listed["total"] == 1
    team = user.get("/v1/models", params={"source": "team", "limit": 200}).json()
    assert model_name in {m["name"] for m in team["items"]}

    bad = user.post("/v1/clusters", json={"name": "lab-bad", "spec": {**cluster, "gpus_per_node": -1}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:3] == ["body", "spec", "gpus_per_node"]
    bad = user.post("/v1/models", json={"name": "bad name!", "spec": spec})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "name"]


def test_plan_command_never_imports_the_web_stack() -> None:
    code = (
        "import sys; from typer.testing import CliRunner; from autopar.cli import app; "
        "r = CliRunner().invoke(app, ['plan', '--model', 'tiny', '--cluster', 'local-cpu', '--gpus', '2', "
        "'--seq-len', '64', '--global-batch', '4', '--json']); assert r.exit_code == 0, r.output; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'uvicorn', 'sqlalchemy', 'starlette', "
        "'alembic', 'psycopg', 'torch'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_trailing_slash_is_not_redirected_to_the_request_host(anon: httpx.Client) -> None:
    """Starlette's slash redirect built its Location from the Host header: a forged Host sent the
    client elsewhere (issue 12, finding 8). Now a path that is not a route is a 404 in the error shape."""
    for path in ("/v1/plans/", "/healthz/", "/v1/runs/"):
        r = anon.get(path, headers={"Host": "attacker.example"}, follow_redirects=False)
        assert r.status_code == 404 and "location" not in r.headers, (path, r.status_code, r.headers)
        assert r.json()["detail"][0]["type"] == "http_error"


def test_the_database_url_is_not_on_the_server_command_line(server: Any) -> None:
    """`ps` shows every process's argv to every user: the URL (a password on PostgreSQL) travels in
    the environment (issue 12, finding 8)."""
    argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert b"serve" in argv and not any(server.database_url.encode() in a for a in argv), argv


OUTSIDE_PATHS = re.compile("|".join([r"\.\./shared", "/tmp/" + "brief", r"(?<![\w.])/" + "work/"]))
"""The sibling checkout, the brief and the workspace the project was written in (spelled in pieces
so that this file does not match itself)."""


def test_nothing_cites_a_path_outside_the_repository() -> None:
    """A fresh clone is the whole project (issue 12, finding 9): no tracked file reads or cites a
    path beside the repository (the vendored Megatron-LM sources are left as they are)."""
    root = Path(__file__).resolve().parents[2]
    vendored = root / "tests" / "planner" / "megatron_lm"
    hits, read = [], 0
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(part.startswith(".") or part.endswith(".egg-info") or part == "__pycache__" for part in rel.parts):
            continue  # .git, .venv, build metadata: not the project's own text
        if path.is_relative_to(vendored) or path.suffix not in {".py", ".md", ".sh", ".toml", ".yaml", ".js", ".html"}:
            continue
        read += 1
        hits += [f"{rel}: {m.group(0)}" for m in OUTSIDE_PATHS.finditer(path.read_text(errors="replace"))]
    assert read > 100 and not hits, hits
