"""`torchrun` launch script: our own runtime (`python -m runtime.launch plan.json`) on every node,
with c10d rendezvous at `$MASTER_ADDR:29500`. The runtime reads the whole plan, so nothing of
the plan is lost; only a job that does not fill whole nodes needs a hand."""

from __future__ import annotations

import hashlib

from planner.exporters.common import (
    LAUNCH_MODULE,
    PLAN_FILE,
    RDZV_PORT,
    ExportResult,
    Job,
    comment_block,
    nodes_note,
    summary_lines,
)


def _rdzv_id(job: Job) -> str:
    """A stable rendezvous id for this layout (every node must pass the same one)."""
    key = f"{job.model.name}|{job.gpus}|{job.lay.model_dump_json()}|{job.chunk_layers}"
    return "autopar-" + hashlib.sha256(key.encode()).hexdigest()[:10]


def export_torchrun(job: Job) -> ExportResult:
    lost = nodes_note(job)
    header = [
        "#!/usr/bin/env bash",
        comment_block(["autopar launch script (torchrun)", *summary_lines(job)]),
        comment_block(
            [
                f"Run this script on each of the {job.nodes} node(s) with MASTER_ADDR set to the first node's",
                f"address and {PLAN_FILE} (the exported plan) in the working directory.",
            ]
        ),
        "set -euo pipefail",
        ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"',
        "",
    ]
    args = [
        f"--nnodes {job.nodes}",
        f"--nproc-per-node {job.gpus_per_node}",
        "--rdzv-backend c10d",
        f'--rdzv-endpoint "$MASTER_ADDR:{RDZV_PORT}"',
        f'--rdzv-id "${{RDZV_ID:-{_rdzv_id(job)}}}"',
        f"-m {LAUNCH_MODULE} {PLAN_FILE}",
    ]
    body = "torchrun \\\n" + " \\\n".join(f"    {a}" for a in args)
    return ExportResult("\n".join(header) + body + "\n", "launch.sh", lost)
