"""The runner protocol's server side: leases, expiry, attempts, profiles, cancel, finish."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx

PROFILE: dict[str, Any] = {
    "plan_id": None, "step_times_s": [0.5, 0.2, 0.2], "step_s": 0.2, "peak_memory_bytes_per_rank": [1000, 1200, None, 900],
    "tokens_per_s": 5120.0, "mfu": 0.05, "environment": {"torch": "2.13.0", "backend": "gloo"}, "losses": [4.1, 4.0],
    "preflight": {"bus_bandwidth_bytes_per_s": 1.5e9, "collective": "all_reduce", "bytes": 1 << 20, "ranks": 4},
    "startup_s_per_rank": [12.5, 13.0, None, 12.0], "startup_phases_s": {"build_s": [0.5, 0.5, None, 0.4]},
    "host_peak_rss_bytes_per_rank": [3000, 3100, None, 2900], "host_memory_predicted_bytes": 2800,
}


class Site:
    """One cluster: its agent token, an agent registered with it, and helpers for the protocol."""

    def __init__(self, server: Any, user: httpx.Client):
        self.server = server
        self.user = user
        self.cluster = f"site-{uuid.uuid4().hex[:8]}"
        self.token = server.token("agent", self.cluster)
        self.http = server.client(self.token)
        self.agent_id = self.register("a0")

    def register(self, name: str) -> int:
        r = self.http.post("/v1/agents", json={"name": name, "cluster": self.cluster, "hostname": "node-0"})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def queue(self, plan_id: int, **kw: Any) -> dict[str, Any]:
        r = self.user.post(f"/v1/plans/{plan_id}/runs", json={"cluster": self.cluster, **kw})
        assert r.status_code == 201, r.text
        return dict(r.json())

    def lease(self, agent_id: int | None = None) -> httpx.Response:
        return self.http.post("/v1/runs/lease", json={"agent_id": agent_id or self.agent_id})

    def heartbeat(self, run_id: int, attempt: int, agent_id: int | None = None, step: int = 1) -> httpx.Response:
        return self.http.post(
            f"/v1/runs/{run_id}/heartbeat",
            json={"agent_id": agent_id or self.agent_id, "attempt": attempt,
                  "progress": {"step": step, "steps": 10, "loss": 3.5, "message": "training"}},
        )

    def finish(self, run_id: int, attempt: int, status: str = "succeeded", agent_id: int | None = None) -> httpx.Response:
        return self.http.post(
            f"/v1/runs/{run_id}/finish",
            json={"agent_id": agent_id or self.agent_id, "attempt": attempt, "status": status, "log_tail": "done\n",
                  "exit_code": 0 if status == "succeeded" else 1},
        )

    def run(self, run_id: int) -> dict[str, Any]:
        r = self.http.get(f"/v1/runs/{run_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())


def _site(server: Any, user: httpx.Client) -> Site:
    return Site(server, user)


def test_full_cycle_with_profile_predicted_beside_measured(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    run = site.queue(tiny_plan["id"], steps=3, launch={"nproc_per_node": 4, "backend": "gloo"})
    assert run["status"] == "queued" and run["attempt"] == 0 and run["launch"]["backend"] == "gloo"
    r = site.lease()
    assert r.status_code == 200, r.text
    lease = r.json()
    assert lease["run"]["id"] == run["id"] and lease["attempt"] == 1 and lease["run"]["status"] == "leased"
    assert lease["plan"]["best"]["layout"] == tiny_plan["plan"]["best"]["layout"]
    assert site.lease().status_code == 204  # queue empty now

    hb = site.heartbeat(run["id"], 1)
    assert hb.status_code == 200 and hb.json()["status"] == "running" and hb.json()["cancel_requested"] is False
    assert site.run(run["id"])["progress"]["step"] == 1

    key = str(uuid.uuid4())
    holder = {"agent_id": site.agent_id, "attempt": 1}
    first = site.http.put(f"/v1/runs/{run['id']}/profile", json=PROFILE, headers={"Idempotency-Key": key}, params=holder)
    assert first.status_code == 201, first.text
    retry = site.http.put(f"/v1/runs/{run['id']}/profile", json=PROFILE, headers={"Idempotency-Key": key}, params=holder)
    other = site.http.put(f"/v1/runs/{run['id']}/profile", json={**PROFILE, "step_s": 9.0},
                          headers={"Idempotency-Key": str(uuid.uuid4())}, params=holder)
    assert retry.status_code == other.status_code == 200
    assert retry.json() == other.json() == first.json()  # one profile per run, whatever the key
    assert first.json()["profile"]["preflight"]["bus_bandwidth_bytes_per_s"] == 1.5e9
    assert first.json()["profile"]["losses"] == [4.1, 4.0]

    done = site.finish(run["id"], 1)
    assert done.status_code == 200 and done.json()["status"] == "succeeded" and done.json()["log_tail"] == "done\n"
    again = site.finish(run["id"], 1)
    assert again.status_code == 200 and again.json()["finished_at"] == done.json()["finished_at"]
    assert done.json()["attempts"] == [{**done.json()["attempts"][0], "attempt": 1, "outcome": "succeeded"}]
    # a finished run shows its end, not the last heartbeat's "step 1/10, training"
    assert done.json()["progress"] == {"step": 10, "steps": 10, "loss": 3.5, "message": "succeeded"}

    profiles = user.get(f"/v1/plans/{tiny_plan['id']}/profiles").json()
    mine = [p for p in profiles["items"] if p["profile"]["run_id"] == run["id"]]
    assert len(mine) == 1
    p = mine[0]
    predicted = tiny_plan["plan"]["best"]["estimate"]
    assert p["predicted"]["step_s"] == predicted["step_s"] and p["measured"]["step_s"] == 0.2
    assert abs(p["error"]["step_s_rel"] - (0.2 - predicted["step_s"]) / predicted["step_s"]) < 1e-12
    assert p["measured"]["peak_memory_bytes_max"] == 1200
    assert p["measured"]["startup_s_per_rank"] == [12.5, 13.0, None, 12.0]
    assert p["measured"]["host_peak_rss_bytes_per_rank"] == [3000, 3100, None, 2900]
    assert p["predicted"]["host_peak_bytes"] == 2800
    assert len(p["predicted"]["peak_bytes_per_stage"]) == predicted["partition"]["pp"]


def test_a_failed_run_keeps_its_last_step_and_says_failed(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    run = site.queue(tiny_plan["id"], steps=10)
    assert site.lease().status_code == 200
    assert site.heartbeat(run["id"], 1, step=4).status_code == 200
    done = site.finish(run["id"], 1, status="failed")
    assert done.status_code == 200, done.text
    assert done.json()["progress"] == {"step": 4, "steps": 10, "loss": 3.5, "message": "failed"}
    assert site.run(run["id"])["progress"]["message"] == "failed"


def test_a_run_is_never_leased_twice_concurrently(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    runs = [site.queue(tiny_plan["id"])["id"] for _ in range(6)]
    agents = [site.register(f"a{i}") for i in range(8)]
    got: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(agents))

    def hammer(agent_id: int) -> None:
        with server.client(site.token) as c:
            start.wait()
            for _ in range(3):
                r = c.post("/v1/runs/lease", json={"agent_id": agent_id})
                with lock:
                    if r.status_code == 200:
                        got.append(r.json()["run"]["id"])
                    elif r.status_code != 204:
                        errors.append(r.text)

    threads = [threading.Thread(target=hammer, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(got) == sorted(runs), Counter(got)  # each run exactly once
    for run_id in runs:
        assert [a["attempt"] for a in site.run(run_id)["attempts"]] == [1]


def test_expired_lease_returns_to_queue_then_fails_after_max_attempts(
    server: Any, user: httpx.Client, tiny_plan: dict[str, Any]
) -> None:
    site = _site(server, user)
    second = site.register("a1")
    run = site.queue(tiny_plan["id"], lease_seconds=1, max_attempts=2)
    assert site.lease().json()["attempt"] == 1
    assert site.heartbeat(run["id"], 1).status_code == 200
    time.sleep(1.3)
    r = site.lease(second)  # the first agent went silent: its lease expired, the run is handed on
    assert r.status_code == 200 and r.json()["attempt"] == 2 and r.json()["run"]["agent_id"] == second
    assert site.heartbeat(run["id"], 1).status_code == 409  # the old holder lost it
    assert site.finish(run["id"], 1).status_code == 409
    history = site.run(run["id"])["attempts"]
    assert [(a["attempt"], a["agent_id"], a["outcome"]) for a in history] == [
        (1, site.agent_id, "lease_expired"), (2, second, "running"),
    ]
    time.sleep(1.3)
    assert site.lease().status_code == 204  # max_attempts used: failed, not requeued
    failed = site.run(run["id"])
    assert failed["status"] == "failed" and failed["failure_reason"] == "lease expired 2 times (max_attempts 2)"
    assert [a["outcome"] for a in failed["attempts"]] == ["lease_expired", "lease_expired"]


def test_lease_waits_for_a_requeue_in_flight_instead_of_answering_empty(
    server: Any, user: httpx.Client, tiny_plan: dict[str, Any]
) -> None:
    """A reaper sweep holding an expired run must not make a concurrent lease answer 204 for it."""
    from datetime import timedelta

    from api.models import utcnow
    from api.runs import expire_leases

    site = _site(server, user)
    second = site.register("a1")
    run = site.queue(tiny_plan["id"], lease_seconds=3, max_attempts=3)
    assert site.lease().status_code == 200
    leased = time.monotonic()
    answers: list[httpx.Response] = []
    with server.db.write_session() as session:  # the "reaper": expires the lease, holds the row until commit
        assert expire_leases(session, site.cluster, now=utcnow() + timedelta(hours=1)) == ["requeued"]
        time.sleep(max(0.0, leased + 3.2 - time.monotonic()))  # the deadline has passed for the server too
        asker = threading.Thread(target=lambda: answers.append(site.lease(second)))
        asker.start()
        asker.join(0.5)
        assert asker.is_alive() and not answers, "the lease answered while the requeue was uncommitted"
    asker.join(30)
    assert len(answers) == 1 and answers[0].status_code == 200, answers[0].text
    assert answers[0].json()["run"]["id"] == run["id"] and answers[0].json()["attempt"] == 2


def test_reaper_requeues_without_any_lease_call(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    run = site.queue(tiny_plan["id"], lease_seconds=1, max_attempts=3)
    assert site.lease().status_code == 200
    deadline = time.monotonic() + 10
    while site.run(run["id"])["status"] != "queued":
        assert time.monotonic() < deadline, site.run(run["id"])
        time.sleep(0.3)
    assert site.run(run["id"])["attempts"][0]["outcome"] == "lease_expired"


def test_cancel_queued_and_running(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    queued = site.queue(tiny_plan["id"])
    r = user.post(f"/v1/runs/{queued['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["cancel_requested"] is True
    assert site.lease().status_code == 204  # a cancelled run is never leased

    running = site.queue(tiny_plan["id"])
    assert site.lease().status_code == 200
    assert site.heartbeat(running["id"], 1).json()["cancel_requested"] is False
    r = user.post(f"/v1/runs/{running['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "running" and r.json()["cancel_requested"] is True
    assert site.heartbeat(running["id"], 1).json()["cancel_requested"] is True
    done = site.finish(running["id"], 1, "cancelled")
    assert done.status_code == 200 and done.json()["status"] == "cancelled"
    assert user.post(f"/v1/runs/{running['id']}/cancel").status_code == 200  # idempotent

    finished = site.queue(tiny_plan["id"])
    site.lease()
    site.finish(finished["id"], 1)
    assert user.post(f"/v1/runs/{finished['id']}/cancel").status_code == 409


def test_profile_before_any_lease_is_refused(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    run = site.queue(tiny_plan["id"])
    r = site.http.put(f"/v1/runs/{run['id']}/profile", json=PROFILE, params={"agent_id": site.agent_id, "attempt": 1})
    assert r.status_code == 409


def test_bad_profile_names_the_field(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    run = site.queue(tiny_plan["id"])
    site.lease()
    holder = {"agent_id": site.agent_id, "attempt": 1}
    r = site.http.put(f"/v1/runs/{run['id']}/profile", json={**PROFILE, "step_times_s": [0.1, -1.0]}, params=holder)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "step_times_s", 1]
    r = site.http.put(f"/v1/runs/{run['id']}/profile", content=b'{"step_s": NaN}',
                      headers={"content-type": "application/json"}, params=holder)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "step_s"]
    r = site.http.put(f"/v1/runs/{run['id']}/profile", json={**PROFILE, "note": "<script>"}, params=holder)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "note"]  # a closed schema


def test_only_the_lease_holder_uploads_the_profile(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    run = site.queue(tiny_plan["id"])
    site.lease()
    other = site.register("a1")  # same cluster, same token, not the holder
    url = f"/v1/runs/{run['id']}/profile"
    assert site.http.put(url, json=PROFILE, params={"agent_id": other, "attempt": 1}).status_code == 409
    assert site.http.put(url, json=PROFILE, params={"agent_id": site.agent_id, "attempt": 2}).status_code == 409
    assert site.http.put(url, json=PROFILE).status_code == 422  # who and which attempt are required
    assert site.http.put(url, json=PROFILE, params={"agent_id": site.agent_id, "attempt": 1}).status_code == 201


def test_runs_list_filters(server: Any, user: httpx.Client, tiny_plan: dict[str, Any]) -> None:
    site = _site(server, user)
    a = site.queue(tiny_plan["id"])
    b = site.queue(tiny_plan["id"])
    user.post(f"/v1/runs/{a['id']}/cancel")
    page = user.get("/v1/runs", params={"cluster": site.cluster}).json()
    assert page["total"] == 2 and {r["id"] for r in page["items"]} == {a["id"], b["id"]}
    queued = user.get("/v1/runs", params={"cluster": site.cluster, "status": "queued"}).json()
    assert [r["id"] for r in queued["items"]] == [b["id"]]
    assert user.get("/v1/runs", params={"plan_id": tiny_plan["id"], "limit": 1}).json()["total"] >= 2


def test_the_stored_profile_goes_back_only_to_its_uploader_or_the_lease_holder(
    server: Any, user: httpx.Client, tiny_plan: dict[str, Any]
) -> None:
    site = _site(server, user)
    run = site.queue(tiny_plan["id"])
    site.lease()
    url = f"/v1/runs/{run['id']}/profile"
    holder = {"agent_id": site.agent_id, "attempt": 1}
    first = site.http.put(url, json=PROFILE, params=holder)
    assert first.status_code == 201 and first.json()["agent_id"] == site.agent_id, first.text  # its author
    assert site.finish(run["id"], 1).status_code == 200
    assert site.http.put(url, json=PROFILE, params=holder).status_code == 200  # the uploader's retry
    other = site.register("a1")  # same token, not the uploader: no "stored" answer for a profile it never sent
    r = site.http.put(url, json=PROFILE, params={"agent_id": other, "attempt": 1})
    assert r.status_code == 409 and f"agent {site.agent_id}" in r.json()["detail"][0]["msg"], r.text


def test_queueing_a_run_honours_the_idempotency_key_per_token(
    server: Any, user: httpx.Client, tiny_plan: dict[str, Any]
) -> None:
    """A blind retry of POST /plans/{id}/runs with the same key answers the run queued the first
    time (200) and queues nothing more; the key with another body is a 409; another token's key is its own."""
    site = _site(server, user)
    key = {"Idempotency-Key": f"queue-{uuid.uuid4().hex[:8]}"}
    body = {"cluster": site.cluster, "steps": 3}
    first = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json=body, headers=key)
    again = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json=body, headers=key)
    assert first.status_code == 201 and again.status_code == 200, (first.text, again.text)
    assert again.json()["id"] == first.json()["id"]
    listed = user.get("/v1/runs", params={"cluster": site.cluster}).json()
    assert [r["id"] for r in listed["items"]] == [first.json()["id"]]  # queued once
    other = user.post(f"/v1/plans/{tiny_plan['id']}/runs", json={**body, "steps": 4}, headers=key)
    assert other.status_code == 409 and other.json()["detail"][0]["loc"] == ["header", "idempotency-key"]
    with server.client(server.token("user")) as stranger:
        theirs = stranger.post(f"/v1/plans/{tiny_plan['id']}/runs", json=body, headers=key)
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
