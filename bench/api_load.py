"""Load and crash test of the planning service, on loopback.

    python -m bench.api_load                       # SQLite in a temporary directory
    python -m bench.api_load --database-url postgresql+psycopg://user:pass@127.0.0.1/db

Phase 1 (load): `--clients` concurrent clients POST /v1/plans (each with its own Idempotency-Key)
and read every accepted plan back, `--requests` POSTs in all. The mix: a share `--large-share`
(default 0.2) of the POSTs are large searches (Llama-3-70B on 512 H100, seq 8192, four global
batches: 0.5-2 s of search each on one core), the rest small ones (`--model` on `--gpus` of
`--cluster`, four global batches: ~0.1 s). A 503 is retried after its Retry-After (as the agent's
client does); its wait counts in the request's latency. Checks: every acknowledged (2xx) plan is
readable with the id it was acknowledged under, the database holds exactly one row per key (none
lost, none duplicated). Reports p50/p95 latency (ms) of POSTs (all, small, large) and GETs,
requests/s, the 503s, and the cores the server had (its planner workers: AUTOPAR_PLAN_WORKERS, by
default one per core of the machine).

Phase 2 (crash): the same load against a fresh server on the same database; after `--kill-after`
acknowledged plans the server is killed with SIGKILL, restarted, and the clients retry what was not
acknowledged with the same keys. Checks: every plan acknowledged before the kill is still there
with its id, and no key has two rows. Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.local_server import LocalServer

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    post_ms: list[float] = field(default_factory=list)
    small_ms: list[float] = field(default_factory=list)  # post_ms of the small jobs
    large_ms: list[float] = field(default_factory=list)  # post_ms of the large jobs
    busy: int = 0  # 503 answers retried
    get_ms: list[float] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)  # Idempotency-Key -> plan id acknowledged
    unacked: list[str] = field(default_factory=list)  # keys whose POST got no 2xx (transport error, 5xx)
    read_back_failures: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


LARGE: dict[str, Any] = {"model": "llama3-70b", "cluster": "dgx-h100", "gpus": 512, "seq_len": 8192, "batch": 256}
"""The large job of the mix (its global batch cycles over 1-4 x `batch`)."""


def _is_large(i: int, share: float) -> bool:
    """Every job i whose share-th multiple crosses an integer: `share` of them, spread evenly."""
    return int((i + 1) * share) > int(i * share)


def _body(i: int, args: argparse.Namespace) -> dict[str, Any]:
    # Distinct requests: the global batch cycles, so plans differ and reads can be checked.
    if _is_large(i, args.large_share):
        return {
            "model": LARGE["model"], "cluster": LARGE["cluster"], "gpus": LARGE["gpus"],
            "training": {"seq_len": LARGE["seq_len"], "global_batch": LARGE["batch"] * (1 + i % 4)},
        }
    return {
        "model": args.model, "cluster": args.cluster, "gpus": args.gpus,
        "training": {"seq_len": args.seq_len, "global_batch": args.gpus * (1 + i % 4)},
    }


def _one(client: httpx.Client, key: str, body: dict[str, Any], tally: Tally, read_back: bool) -> None:
    t0 = time.perf_counter()
    while True:
        try:
            r = client.post("/v1/plans", json=body, headers={"Idempotency-Key": key})
        except httpx.TransportError:
            with tally.lock:
                tally.unacked.append(key)
            return
        if r.status_code != 503 or time.perf_counter() - t0 > 600:
            break
        with tally.lock:
            tally.busy += 1
        time.sleep(float(r.headers.get("retry-after", "1")))
    dt = (time.perf_counter() - t0) * 1e3
    with tally.lock:
        tally.statuses[r.status_code] = tally.statuses.get(r.status_code, 0) + 1
        if r.status_code not in (200, 201):
            tally.unacked.append(key)
            return
        tally.post_ms.append(dt)
        (tally.large_ms if body["model"] == LARGE["model"] else tally.small_ms).append(dt)
        tally.acked[key] = int(r.json()["id"])
    if not read_back:
        return
    plan_id = tally.acked[key]
    t0 = time.perf_counter()
    try:
        g = client.get(f"/v1/plans/{plan_id}")
    except httpx.TransportError:
        return  # the server died between the POST and the read; verified after the restart
    with tally.lock:
        tally.get_ms.append((time.perf_counter() - t0) * 1e3)
        batch = g.json()["plan"]["inputs"]["training"]["global_batch"] if g.status_code == 200 else None
        if batch != body["training"]["global_batch"]:
            tally.read_back_failures.append(f"{key}: GET /v1/plans/{plan_id} -> {g.status_code}")


def _drive(url: str, token: str, jobs: list[tuple[str, dict[str, Any]]], clients: int, tally: Tally,
           stop: Callable[[], bool] = lambda: False) -> float:
    """Run the jobs on `clients` threads (one HTTP connection each); returns wall seconds."""
    queue = list(jobs)
    qlock = threading.Lock()

    def worker() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as c:
            while True:
                with qlock:
                    if not queue or stop():
                        return
                    key, body = queue.pop(0)
                _one(c, key, body, tally, read_back=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        for f in [pool.submit(worker) for _ in range(clients)]:
            f.result()
    return time.perf_counter() - t0


def _rows_per_key(database_url: str, keys: list[str]) -> dict[str, list[int]]:
    from sqlalchemy import select

    from api.db import Database
    from api.models import PlanRow

    db = Database(database_url)
    try:
        with db.read_session() as s:
            rows = s.execute(select(PlanRow.idempotency_key, PlanRow.id).where(PlanRow.idempotency_key.in_(keys))).all()
    finally:
        db.dispose()
    out: dict[str, list[int]] = {k: [] for k in keys}
    for key, ident in rows:
        if key is not None:
            out[key].append(ident)
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def _token(database_url: str) -> str:
    from api.auth import create_token
    from api.db import Database

    db = Database(database_url)  # migrated by the server, which starts first (its code may be older)
    with db.write_session() as s:
        _, secret = create_token(s, f"bench-{uuid.uuid4().hex[:6]}")
    db.dispose()
    return secret


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="autopar-bench-"))
    database_url = args.database_url or f"sqlite:///{workdir / 'bench.db'}"
    report: dict[str, Any] = {
        "database": database_url.split(":", 1)[0], "clients": args.clients, "cores": _cores(),
        "plan_workers": int(os.environ.get("AUTOPAR_PLAN_WORKERS") or _cores()),
        "large_share": args.large_share,
    }

    # --- phase 1: load ---------------------------------------------------------------------------
    code = Path(args.code_dir).resolve() if args.code_dir else REPO
    server = LocalServer(database_url, workdir / "server.log", cwd=code)
    server.start(timeout_s=180)
    token = _token(database_url)
    tally = Tally()
    jobs = [(f"load-{uuid.uuid4().hex}", _body(i, args)) for i in range(args.requests)]
    try:
        wall = _drive(server.url, token, jobs, args.clients, tally)
    finally:
        server.stop()
    rows = _rows_per_key(database_url, [k for k, _ in jobs])
    lost = [k for k, ident in tally.acked.items() if rows[k] != [ident]]
    dup = [k for k, ids in rows.items() if len(ids) > 1]
    n_req = len(tally.post_ms) + len(tally.get_ms)
    report["load"] = {
        "posts": len(jobs), "acknowledged": len(tally.acked), "statuses": tally.statuses, "retried_503": tally.busy,
        "post_p50_ms": round(_pct(tally.post_ms, 50), 1), "post_p95_ms": round(_pct(tally.post_ms, 95), 1),
        "small_p50_ms": round(_pct(tally.small_ms, 50), 1), "small_p95_ms": round(_pct(tally.small_ms, 95), 1),
        "large_p50_ms": round(_pct(tally.large_ms, 50), 1), "large_p95_ms": round(_pct(tally.large_ms, 95), 1),
        "get_p50_ms": round(_pct(tally.get_ms, 50), 1), "get_p95_ms": round(_pct(tally.get_ms, 95), 1),
        "requests_per_s": round(n_req / wall, 2), "plans_per_s": round(len(tally.acked) / wall, 2),
        "wall_s": round(wall, 2), "lost": len(lost), "duplicated": len(dup),
        "read_back_failures": len(tally.read_back_failures),
    }
    ok = not lost and not dup and not tally.read_back_failures and len(tally.acked) == len(jobs)

    # --- phase 2: kill -9 in the middle, restart, retry -------------------------------------------
    server = LocalServer(database_url, workdir / "server-crash.log", cwd=code)
    server.start(timeout_s=180)
    crash = Tally()
    jobs = [(f"crash-{uuid.uuid4().hex}", _body(i, args)) for i in range(args.crash_requests)]
    killed = threading.Event()

    def killer() -> None:
        while len(crash.acked) < args.kill_after and server.proc is not None and server.proc.poll() is None:
            time.sleep(0.01)
        server.kill9()
        killed.set()

    kt = threading.Thread(target=killer)
    kt.start()
    _drive(server.url, token, jobs, args.clients, crash, stop=killed.is_set)
    kt.join()
    acked_before = dict(crash.acked)
    server.start(timeout_s=180)  # same database, new process
    retry = [(k, b) for k, b in jobs if k not in acked_before]
    after = Tally()
    try:
        _drive(server.url, token, retry, args.clients, after)
        with httpx.Client(base_url=server.url, timeout=60) as c:
            missing = [k for k, ident in acked_before.items() if c.get(f"/v1/plans/{ident}").status_code != 200]
    finally:
        server.stop()
    rows = _rows_per_key(database_url, [k for k, _ in jobs])
    changed = [k for k, ident in acked_before.items() if rows[k] != [ident]]
    dup = [k for k, ids in rows.items() if len(ids) > 1]
    unstored = [k for k, ids in rows.items() if not ids]
    report["crash"] = {
        "posts": len(jobs), "acknowledged_before_kill": len(acked_before),
        "unacknowledged_at_kill": len(jobs) - len(acked_before),
        "retried_after_restart": len(retry), "acknowledged_after_restart": len(after.acked),
        "acknowledged_missing_after_restart": len(missing) + len(changed), "duplicated": len(dup),
        "keys_without_a_plan": len(unstored),
    }
    ok = ok and not missing and not changed and not dup and not unstored and len(acked_before) >= args.kill_after
    report["ok"] = ok
    report["workdir"] = str(workdir)
    return report


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=None, help="default: SQLite file in a temporary directory")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=160, help="POSTs in the load phase")
    p.add_argument("--crash-requests", type=int, default=96, help="POSTs in the crash phase")
    p.add_argument("--kill-after", type=int, default=32, help="acknowledged POSTs before the SIGKILL")
    p.add_argument("--model", default="tiny")
    p.add_argument("--cluster", default="local-cpu")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--large-share", type=float, default=0.2, help="share of large searches in the mix (0-1)")
    p.add_argument("--code-dir", default=None, help="run the server from this checkout (default: this one)")
    a = p.parse_args(argv)
    report = run(a)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
