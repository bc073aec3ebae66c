"""Shared helpers of the agent tests: a stdlib HTTP server that speaks the runner protocol
(docs/architecture.md, "Service and runner agent") from a dict, for tests of the agent alone; the
end-to-end test uses the real service (`autopar serve`)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent import runner as runner_mod
from agent.launcher import LaunchSpec
from api.local_server import free_port

__all__ = ["FAKE_RUNTIME", "FakeServer", "fake_runtime", "fake_server", "free_port"]

# A stand-in runtime: forks a grandchild (recorded in grandchild.pid), writes progress.json after
# each of STEPS steps of STEP_S seconds, then profile.json. argv: STEPS STEP_S
FAKE_RUNTIME = r"""
import json, os, subprocess, sys, time
steps, step_s = int(sys.argv[1]), float(sys.argv[2])
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open("grandchild.pid", "w").write(str(g.pid))
for i in range(1, steps + 1):
    time.sleep(step_s)
    json.dump({"step": i, "steps": steps, "loss": 5.0 / i, "step_s": step_s}, open("progress.tmp", "w"))
    os.replace("progress.tmp", "progress.json")
    print(f"step {i}", flush=True)
json.dump({"step_s": step_s, "step_times_s": [step_s] * steps, "tokens_per_s": 1.0, "mfu": float("nan")},
          open("profile.json", "w"))
g.kill()
"""


@dataclass
class FakeServer:
    """Contract server state; `calls` records (method, path, headers, body) of every request."""

    port: int
    queue: list[dict[str, Any]] = field(default_factory=list)  # lease answers, popped in order
    calls: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    heartbeat_answer: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]] | None = None
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    atlases: dict[str, dict[str, Any]] = field(default_factory=dict)  # kernel profiles stored, by cluster
    lock: threading.Lock = field(default_factory=threading.Lock)
    httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _, _ in self.calls if method in (None, m)]

    def bodies(self, suffix: str) -> list[Any]:
        return [b for _, p, _, b in self.calls if p.endswith(suffix)]

    def handle(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        with self.lock:
            self.calls.append((method, path, headers, body))
            if path == "/v1/agents":
                return 201, {"id": 7, "name": body["name"], "cluster": body["cluster"]}
            if path == "/v1/runs/lease":
                return (200, self.queue.pop(0)) if self.queue else (204, None)
            if path.endswith("/heartbeat"):
                if self.heartbeat_answer is not None:
                    return self.heartbeat_answer(body)
                return 200, {"lease_deadline": "2099-01-01T00:00:00+00:00", "cancel_requested": False}
            if path.endswith("/profile"):
                run = path.split("/")[3]
                if run in self.profiles:
                    return 200, self.profiles[run]
                self.profiles[run] = {"id": len(self.profiles) + 1, "key": headers.get("idempotency-key")}
                return 201, self.profiles[run]
            if path.startswith("/v1/clusters/") and path.endswith("/atlas"):
                self.atlases[path.split("/")[3]] = body
                return 200, {"cluster": path.split("/")[3], "points": len(body.get("gemm", []))}
            if path.endswith("/finish"):
                return 200, {"id": path.split("/")[3], "status": body["status"]}
        return 404, {"detail": "no such path"}

    def reserve(self) -> None:
        """Bind the port without listening: connections are refused, as with no server, but no other
        process can take the port before `start` (a test of a server that comes up late)."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler(), bind_and_activate=False)
        self.httpd.server_bind()

    def start(self) -> None:
        if self.httpd is None:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        else:  # reserved: listen now
            self.httpd.server_activate()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self, method: str) -> None:
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else None
                headers = {k.lower(): v for k, v in self.headers.items()}
                path, _, query = self.path.partition("?")
                if query:
                    headers["x-query"] = query  # the protocol's query parameters, for the tests to read
                code, out = server.handle(method, path, headers, body)
                data = b"" if out is None else json.dumps(out).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                self._any("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._any("PUT")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    srv = FakeServer(free_port())
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    script = tmp_path / "fake_runtime.py"
    script.write_text(FAKE_RUNTIME)

    def argv(spec: LaunchSpec, plan_file: Path, profile_file: Path, progress_file: Path) -> list[str]:
        assert plan_file.parent == profile_file.parent == progress_file.parent
        return [sys.executable, str(script), str(spec.steps), "0.3"]

    monkeypatch.setattr(runner_mod, "runtime_argv", argv)
    return script
