"""A real `autopar serve` in a child process on a free loopback port: what the API tests, the agent's
end-to-end test and `bench/api_load.py` talk HTTP to.

    server = LocalServer("sqlite:////tmp/a.db", Path("/tmp/server.log"))
    server.start()          # returns once GET /healthz answers 200
    ...
    server.stop()           # SIGTERM, then SIGKILL after a grace period; kill9() for a crash

Only loopback addresses are used; the server's output goes to `log_path`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["LocalServer", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """`AUTOPAR_DATABASE_URL=URL python -m autopar.cli serve --port P` as a child process."""

    def __init__(
        self, database_url: str, log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the server and wait until GET /healthz answers 200 (RuntimeError with the log's
        tail when it exits or does not answer within `timeout_s` seconds)."""
        self.proc = subprocess.Popen(  # the URL (a password, on PostgreSQL) in the environment, not in `ps`
            [sys.executable, "-m", "autopar.cli", "serve", "--port", str(self.port), "--log-level", "warning"],
            cwd=self.cwd, env={**self.env, "AUTOPAR_DATABASE_URL": self.database_url},
            stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not answer within {timeout_s} s:\n{self._log_tail()}")

    def kill9(self) -> None:
        """SIGKILL, as a crashed host would lose it: no shutdown handlers run."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self, kill: bool = False, grace_s: float = 15.0) -> None:
        """SIGTERM (SIGKILL when `kill`), then SIGKILL if it has not exited after `grace_s` seconds."""
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=grace_s)
        self.proc = None

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return f"(no log at {self.log_path})"
