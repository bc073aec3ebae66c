"""The service's read paths at scale: listing plans over 10,000 stored ones, and a cluster's
calibration page over 200 stored profiles.

    python -m bench.api_reads [--plans 10000] [--profiles 200] [--code-dir DIR] [--json]

A server (`autopar serve` on SQLite in a temporary directory) plans two jobs through the API (a
Llama-3-70B plan on 1,024 H100, ~125 KB of JSON, and a tiny plan on a registered CPU cluster);
their rows are then copied straight into the database: `--plans` plan rows, and `--profiles`
(plan, run, profile) triples on the registered cluster, each profile measuring 2 x its plan's
predicted step with a 5% spread (seeded). Only columns that exist since migration 0003 are written,
so `--code-dir` may point at an older checkout of the repository to measure it the same way (its
server runs from that directory; this file's tables define the rows).

Reported: GET /v1/plans?limit=200 latency (p50 / p95 of 20 reads, ms) and the server's resident
memory (VmRSS, MiB) before and after them; GET /v1/clusters/{name}/calibration latency on the first
read after the profiles were stored and on the next read (ms), and, where the server computes the
error report in the background, the seconds until it covers every profile.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Table, insert, select

from api.local_server import LocalServer

REPO = Path(__file__).resolve().parents[1]
BIG_PLAN = {"model": "llama3-70b", "cluster": "dgx-h100", "gpus": 1024, "training": {"seq_len": 8192, "global_batch": 512}}
PLAN_COLUMNS = ("created_at", "created_by", "model_name", "cluster_name", "gpus", "seq_len", "global_batch", "precision",
                "feasible", "step_s", "tokens_per_s", "mfu", "calibration", "plan")
"""Columns of `plans` written (every one exists since migration 0001)."""


def _table(model: Any) -> Table:
    table: Table = model.__table__
    return table


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def _token(database_url: str) -> str:
    from api.auth import create_token
    from api.db import Database

    db = Database(database_url)
    with db.write_session() as s:
        _, secret = create_token(s, f"bench-{uuid.uuid4().hex[:6]}")
    db.dispose()
    return secret


def _copy_plans(database_url: str, template_id: int, n: int) -> None:
    from api.db import Database
    from api.models import PlanRow

    db = Database(database_url)
    table = _table(PlanRow)
    with db.read_session() as s:
        row = s.execute(select(*(table.c[c] for c in PLAN_COLUMNS)).where(table.c.id == template_id)).one()
    base = dict(zip(PLAN_COLUMNS, row, strict=True))
    start = datetime.now(UTC) - timedelta(days=1)
    for first in range(0, n, 500):
        rows = [{**base, "created_at": start + timedelta(seconds=i), "gpus": base["gpus"] + i % 7}
                for i in range(first, min(n, first + 500))]
        with db.write_session() as s:
            s.execute(insert(table), rows)
    db.dispose()


def _copy_profiles(database_url: str, plan: dict[str, Any], cluster: str, n: int, seed: int = 0) -> None:
    """n (plan, run, profile) triples on `cluster`: copies of `plan` measured at 2 x +- 5%."""
    from api.db import Database
    from api.models import AgentRow, ApiToken, PlanRow, ProfileRow, RunRow

    rng = random.Random(seed)
    db = Database(database_url)
    now = datetime.now(UTC)
    with db.write_session() as s:
        token_id = s.execute(select(ApiToken.id).limit(1)).scalar_one()
        agent_id = s.execute(insert(_table(AgentRow)).values(
            name="bench", cluster=cluster, hostname="bench", token_id=token_id, registered_at=now, last_seen_at=now,
        ).returning(_table(AgentRow).c.id)).scalar_one()
        table = _table(PlanRow)
        base = dict(zip(PLAN_COLUMNS, s.execute(select(*(table.c[c] for c in PLAN_COLUMNS))
                                                .where(table.c.id == plan["id"])).one(), strict=True))
        for i in range(n):
            plan_id = s.execute(insert(table).values(**{**base, "created_at": now}).returning(table.c.id)).scalar_one()
            run_id = s.execute(insert(_table(RunRow)).values(
                plan_id=plan_id, cluster=cluster, status="succeeded", steps=5, max_attempts=3, lease_seconds=60,
                launch={"nproc_per_node": None, "backend": "gloo"}, attempt=1, agent_id=agent_id,
                cancel_requested=False, created_at=now, updated_at=now, finished_at=now, created_by=token_id,
            ).returning(_table(RunRow).c.id)).scalar_one()
            step = 2.0 * plan["step_s"] * rng.uniform(0.95, 1.05)
            profile = {"step_s": step, "step_times_s": [step] * 5, "tokens_per_s": 1.0 / step}
            s.execute(insert(_table(ProfileRow)).values(
                run_id=run_id, plan_id=plan_id, cluster=cluster, attempt=1, agent_id=agent_id, created_at=now,
                step_s=step, profile=profile,
            ))
            if i % 50 == 49:
                s.flush()
    db.dispose()


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="autopar-reads-"))
    url = f"sqlite:///{workdir / 'reads.db'}"
    code = Path(args.code_dir).resolve() if args.code_dir else REPO
    server = LocalServer(url, workdir / "server.log", cwd=code)
    server.start(timeout_s=180)
    report: dict[str, Any] = {"code": str(code), "plans": args.plans, "profiles": args.profiles}
    try:
        assert server.proc is not None
        token = _token(url)
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as c:
            big = c.post("/v1/plans", json=BIG_PLAN)
            assert big.status_code == 201, big.text
            report["plan_json_bytes"] = len(json.dumps(big.json()["plan"]))
            _copy_plans(url, big.json()["id"], args.plans)
            rss0 = _rss_mib(server.proc.pid)
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                r = c.get("/v1/plans", params={"limit": 200})
                times.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200 and len(r.json()["items"]) == 200
            report["list_200"] = {"p50_ms": round(_pct(times, 50), 1), "p95_ms": round(_pct(times, 95), 1),
                                  "rss_before_mib": round(rss0, 1), "rss_after_mib": round(_rss_mib(server.proc.pid), 1),
                                  "stored_plans": r.json()["total"]}

            cluster = f"lab-{uuid.uuid4().hex[:6]}"
            r = c.post("/v1/clusters", json={"name": cluster, "spec": {"preset": "local-cpu"}})
            assert r.status_code == 201, r.text
            tiny = c.post("/v1/plans", json={"model": "tiny", "cluster": cluster, "gpus": 2,
                                             "training": {"seq_len": 512, "global_batch": 32}})
            assert tiny.status_code == 201, tiny.text
            _copy_profiles(url, tiny.json(), cluster, args.profiles)
            reads = []
            t_stored = time.perf_counter()
            for _ in range(2):
                t0 = time.perf_counter()
                r = c.get(f"/v1/clusters/{cluster}/calibration")
                reads.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
            cal: dict[str, Any] = {"first_read_ms": round(reads[0], 1), "second_read_ms": round(reads[1], 1),
                                   "n_profiles": r.json()["n_profiles"],
                                   "compute_multiplier": round(r.json()["time_multipliers"]["compute"], 3)}
            if "errors_current" in r.json():
                while not r.json()["errors_current"] and time.perf_counter() - t_stored < 600:
                    time.sleep(0.2)
                    r = c.get(f"/v1/clusters/{cluster}/calibration")
                cal["error_report_after_s"] = round(time.perf_counter() - t_stored, 1)
            report["calibration"] = cal
    finally:
        server.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plans", type=int, default=10_000)
    p.add_argument("--profiles", type=int, default=200)
    p.add_argument("--code-dir", default=None, help="run the server from this checkout (default: this one)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    report = run(a)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
