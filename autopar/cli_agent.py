"""`autopar agent`: the runner agent's command. Imports only typer at module level; the agent
(httpx, no torch) loads when the command runs."""

from __future__ import annotations

import re
from pathlib import Path

import typer

_CLUSTER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def agent(
    server: str = typer.Option(..., help="service URL, e.g. http://127.0.0.1:8000"),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="file holding the agent token (mode 600); default: $AUTOPAR_AGENT_TOKEN",
    ),
    token: str | None = typer.Option(
        None, "--token", help="the agent token itself: visible to every user in `ps`; prefer "
        "AUTOPAR_AGENT_TOKEN or --token-file",
    ),
    cluster: str = typer.Option(..., help="cluster name this agent serves (the token's cluster)"),
    workdir: Path = typer.Option(Path("autopar-agent"), help="per-run work dirs go here"),
    name: str | None = typer.Option(None, help="agent name (default host-pid)"),
    poll_s: float = typer.Option(2.0, help="seconds between lease polls when the queue is empty"),
    once: bool = typer.Option(False, help="poll once, run at most one run, exit"),
    preflight: bool = typer.Option(False, help="all-reduce bandwidth test before each run, uploaded with the profile"),
    preflight_bytes: int = typer.Option(4 * 2**20, help="pre-flight all-reduce buffer, bytes"),
    profile_kernels: bool = typer.Option(
        False, help="before a new plan's first run: measure its kernels on this node (autopar profile) and store "
        "them as the cluster's kernel profile (PUT /v1/clusters/{name}/atlas; a team cluster), which prices "
        "later plans for it",
    ),
    profile_max_seconds: float = typer.Option(300.0, help="with --profile-kernels: seconds of timing at most"),
    heartbeat_s: float | None = typer.Option(None, help="heartbeat period, s (default: a third of the lease)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Serve one cluster: lease queued runs, launch them through torchrun, report progress and profiles.

    The token comes from $AUTOPAR_AGENT_TOKEN or --token-file, never needs the command line (`ps`
    shows every process's argv), and never reaches the launched training processes."""
    import logging
    import signal

    from autopar.cli_secrets import agent_token
    from autopar.cli_support import require_extra

    secret = agent_token(token, token_file)

    require_extra("api", "agent", ["httpx"])
    require_extra("runtime", "agent", ["torch"])  # the runs it launches train with torch
    from agent.runner import Agent, AgentConfig

    if not _CLUSTER.match(cluster):
        raise typer.BadParameter("cluster must match ^[A-Za-z0-9._-]{1,64}$", param_hint="--cluster")
    if poll_s <= 0 or preflight_bytes <= 0 or profile_max_seconds <= 0 or (heartbeat_s is not None and heartbeat_s <= 0):
        raise typer.BadParameter("--poll-s, --preflight-bytes, --profile-max-seconds and --heartbeat-s must be positive")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s agent %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = AgentConfig(
        server=server, token=secret, cluster=cluster, workdir=workdir.resolve(), poll_s=poll_s, once=once,
        preflight=preflight, preflight_bytes=preflight_bytes, heartbeat_s=heartbeat_s,
        profile_kernels=profile_kernels, profile_max_seconds=profile_max_seconds,
    )
    if name:
        cfg.name = name
    runner = Agent(cfg)

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("autopar.agent").warning("signal %d: stopping", signum)
        runner.terminate.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        code = runner.run_forever()
    finally:
        runner.client.close()
    raise typer.Exit(code)
