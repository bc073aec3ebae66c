"""HTTP client of the runner protocol (docs/architecture.md, "Service and runner agent"; the server
side is `api/runs.py` and `api/routes/runs.py`).

Every call goes through `ApiClient.request`, which retries what a restarting or overloaded server
answers (connection refused or reset, timeouts, 429, 502, 503, 504) with exponential backoff and
jitter, bounded by both a number of tries and an elapsed-time budget. Any other answer (2xx, 204,
4xx, 500) is returned to the caller, who knows whether it is final.

Backoff: the k-th wait (k = 0, 1, ...) is d_k = min(cap_s, base_s x 2^k); the sleep is drawn
uniformly from [d_k / 2, d_k] ("equal jitter", AWS Architecture Blog, "Exponential Backoff And
Jitter", 2015), so agents restarted together do not retry in lockstep.

Writes the server must not apply twice are safe to retry: the profile upload carries an
Idempotency-Key (exactly one profile per run whatever the key, the contract says), finish is
idempotent per attempt, heartbeats only extend a lease. A lease whose answer was lost is the one
call that is not: its run waits out the lease deadline and is re-queued by the server.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger("autopar.agent")

RETRY_STATUS = frozenset({429, 502, 503, 504})


class ServerUnavailable(RuntimeError):
    """The server did not answer within the retry budget."""


class ProtocolError(RuntimeError):
    """The server answered with a status the protocol does not allow here."""

    def __init__(self, response: httpx.Response, what: str):
        self.status_code = response.status_code
        body = response.text[:500]
        super().__init__(f"{what}: HTTP {response.status_code}: {body}")


@dataclass(frozen=True)
class RetryPolicy:
    tries: int = 8
    max_elapsed_s: float = 60.0
    base_s: float = 0.5
    cap_s: float = 8.0

    def delay(self, k: int, rng: random.Random) -> float:
        """Seconds to sleep before try k+1 (k >= 0): equal jitter on min(cap, base x 2^k)."""
        d = min(self.cap_s, self.base_s * 2.0**k)
        return rng.uniform(d / 2.0, d)


class ApiClient:
    """Bearer-token client for the runner endpoints; one httpx.Client, safe to share between the
    main thread and the heartbeat thread (httpx.Client is thread-safe for requests)."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        seed: int | None = None,
    ):
        self.server = server.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._http = httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "autopar-agent"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> httpx.Response:
        """Send with retries (module docstring). Raises `ServerUnavailable` when the budget runs out."""
        policy = retry or self.retry
        start = time.monotonic()
        last: str = ""
        for k in range(policy.tries):
            try:
                resp = self._http.request(method, path, json=json, headers=headers, params=params)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code not in RETRY_STATUS:
                    return resp
                last = f"HTTP {resp.status_code}"
            if k == policy.tries - 1:
                break
            wait = policy.delay(k, self._rng)
            if time.monotonic() - start + wait > policy.max_elapsed_s:
                break
            log.warning("%s %s failed (%s); retrying in %.1f s", method, path, last, wait)
            time.sleep(wait)
        raise ServerUnavailable(f"{method} {self.server}{path}: {last} (gave up after {time.monotonic() - start:.1f} s)")

    # ---- the protocol ---------------------------------------------------------------------------
    def register(self, name: str, cluster: str, hostname: str) -> dict[str, Any]:
        r = self.request("POST", "/v1/agents", json={"name": name, "cluster": cluster, "hostname": hostname})
        if r.status_code not in (200, 201):
            raise ProtocolError(r, "register")
        try:
            info = r.json()
        except ValueError:
            info = None
        if not isinstance(info, dict) or "id" not in info:
            raise ProtocolError(r, "register answer names no agent id")
        return info

    def lease(self, agent_id: Any) -> dict[str, Any] | None:
        """The leased run (run, plan, attempt, lease_deadline), or None when the queue is empty."""
        r = self.request("POST", "/v1/runs/lease", json={"agent_id": agent_id})
        if r.status_code == 204:
            return None
        if r.status_code != 200:
            raise ProtocolError(r, "lease")
        try:
            return r.json()  # its shape is checked by agent.lease.Lease before anything runs
        except ValueError:
            raise ProtocolError(r, "lease answer is not JSON") from None

    def heartbeat(
        self, run_id: Any, agent_id: Any, attempt: int, progress: dict[str, Any], retry: RetryPolicy | None = None
    ) -> httpx.Response:
        """The raw answer: 200 {lease_deadline, cancel_requested} or 409 (lease lost)."""
        body = {"agent_id": agent_id, "attempt": attempt, "progress": progress}
        return self.request("POST", f"/v1/runs/{run_id}/heartbeat", json=body, retry=retry)

    def put_profile(
        self, run_id: Any, agent_id: Any, attempt: int, profile: dict[str, Any], idempotency_key: str,
        retry: RetryPolicy | None = None,
    ) -> dict[str, Any]:
        r = self.request(
            "PUT", f"/v1/runs/{run_id}/profile", json=profile, headers={"Idempotency-Key": idempotency_key},
            params={"agent_id": agent_id, "attempt": attempt}, retry=retry,
        )
        if r.status_code not in (200, 201):
            raise ProtocolError(r, "profile upload")
        return r.json()

    def put_atlas(self, cluster: str, atlas: dict[str, Any], retry: RetryPolicy | None = None) -> httpx.Response:
        """The raw answer of storing the cluster's measured kernel profile (200, or 404 / 409 / 422)."""
        return self.request("PUT", f"/v1/clusters/{cluster}/atlas", json=atlas, retry=retry)

    def finish(
        self, run_id: Any, agent_id: Any, attempt: int, status: str, log_tail: str, exit_code: int | None,
        retry: RetryPolicy | None = None,
    ) -> httpx.Response:
        """The raw answer: 200 Run, or 409 when the attempt no longer holds the run."""
        body = {
            "agent_id": agent_id, "attempt": attempt, "status": status, "log_tail": log_tail, "exit_code": exit_code,
        }
        return self.request("POST", f"/v1/runs/{run_id}/finish", json=body, retry=retry)
