"""`torchrun` launch script for the user's own training script, with the plan's degrees in the
environment; `--autopar-runtime` runs autopar's reference runtime (`python -m runtime.launch
plan.json`) on the same rendezvous instead.

    MASTER_ADDR=<first node> bash launch.sh train.py --your --args     # your script
    MASTER_ADDR=<first node> bash launch.sh --autopar-runtime          # autopar's runtime

The script embeds the plan it was exported from and writes it to `$AUTOPAR_PLAN` (default
`plan.json`), so both lines find it. The degrees are exported as `AUTOPAR_*` variables (see
`plan_environment`); a training script that builds its own device mesh reads them, nothing else of
the plan needs a framework. c10d rendezvous at `$MASTER_ADDR:$MASTER_PORT` (default 29500).

Every value is written through `shlex.quote`; user text (model, cluster, GPU names) appears only in
comments (escaped by `one_line`) and inside the single-quoted plan JSON."""

from __future__ import annotations

import hashlib
import shlex

from planner.exporters.common import (
    LAUNCH_MODULE,
    PLAN_FILE,
    RDZV_PORT,
    ExportResult,
    Job,
    comment_block,
    nodes_note,
    notes_lines,
    summary_lines,
)


def _rdzv_id(job: Job) -> str:
    """A stable rendezvous id for this layout (every node must pass the same one)."""
    key = f"{job.model.name}|{job.gpus}|{job.lay.model_dump_json()}|{job.chunk_layers}"
    return "autopar-" + hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest()[:10]


def plan_environment(job: Job) -> dict[str, str]:
    """The plan's layout as `AUTOPAR_*` environment variables (all values decimal integers or
    plain words; `AUTOPAR_STAGE_LAYERS` is the layers per pipeline chunk, comma separated, in
    model order)."""
    lay, tr = job.lay, job.training
    env = {
        "AUTOPAR_WORLD_SIZE": job.gpus,
        "AUTOPAR_DP": job.dp,
        "AUTOPAR_DP_SHARD": job.dp_shard,
        "AUTOPAR_DP_REPLICATE": job.dp_replicate,
        "AUTOPAR_TP": lay.tp,
        "AUTOPAR_SP": int(lay.sp_),
        "AUTOPAR_PP": lay.pp,
        "AUTOPAR_VPP": lay.vpp,
        "AUTOPAR_CP": lay.cp,
        "AUTOPAR_CP_ATTENTION": lay.cp_attention,
        "AUTOPAR_EP": lay.ep,
        "AUTOPAR_ETP": lay.etp_,
        "AUTOPAR_ZERO_STAGE": lay.zero_stage,
        "AUTOPAR_OFFLOAD_OPTIMIZER": int(lay.offload_optimizer),
        "AUTOPAR_MICRO_BATCH": lay.micro_batch,
        "AUTOPAR_GRAD_ACCUM": lay.grad_accum_,
        "AUTOPAR_GLOBAL_BATCH": tr.global_batch,
        "AUTOPAR_SEQ_LEN": tr.seq_len,
        "AUTOPAR_PRECISION": tr.precision,
        "AUTOPAR_GRAD_DTYPE": tr.grad_dtype,
        "AUTOPAR_RECOMPUTE": lay.recompute,
        "AUTOPAR_RECOMPUTE_LAYERS": "all" if lay.recompute_layers is None else lay.recompute_layers,
        "AUTOPAR_SCHEDULE": lay.schedule_,
        "AUTOPAR_STAGE_LAYERS": ",".join(str(n) for n in job.chunk_layers),
        "AUTOPAR_RANK_ORDER": lay.order,
        "AUTOPAR_CROSS_ENTROPY": lay.cross_entropy_,
        "AUTOPAR_NORM_KERNEL": lay.norm_kernel,
        "AUTOPAR_TP_COMM_OVERLAP": int(lay.tp_comm_overlap_),
        "AUTOPAR_FRAMEWORK": lay.framework,
    }
    return {k: str(v) for k, v in env.items()}


_PLAN_DELIMITER = "AUTOPAR_PLAN_JSON"


def export_torchrun(job: Job) -> ExportResult:
    lost = nodes_note(job)
    if job.lay.offload_params:
        lost.append("parameter offload: the reference runtime keeps each rank's weight shard on its GPU")
    if job.training.method == "qlora":
        lost.append("qlora: the reference runtime has no 4-bit base weights and refuses the run "
                    "(runtime.lora); use the accelerate or deepspeed export with bitsandbytes")
    elif job.training.method == "lora" and job.lay.tp > 1:
        lost.append("lora with tensor parallelism: the reference runtime refuses it (no TP plan for adapters)")
    plan_json = job.plan_json
    # One line, ASCII only (pydantic escapes control characters in strings): the quoted
    # here-document below ends only at a line that is exactly the delimiter.
    assert "\n" not in plan_json and _PLAN_DELIMITER not in plan_json.splitlines()
    env_lines = [f"export {k}={shlex.quote(v)}" for k, v in plan_environment(job).items()]
    torchrun = [
        "torchrun",
        f"--nnodes {job.nodes}",
        f"--nproc-per-node {job.gpus_per_node}",
        "--rdzv-backend c10d",
        '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"',
        '--rdzv-id "$RDZV_ID"',
    ]
    head = " \\\n    ".join(torchrun)
    lines = [
        "#!/usr/bin/env bash",
        comment_block(["autopar launch script (torchrun)", *summary_lines(job)]),
        comment_block(
            [
                f"Run on each of the {job.nodes} node(s), with MASTER_ADDR the first node's address:",
                "  bash launch.sh TRAIN_SCRIPT [ARGS...]   your training script; the plan's degrees are in AUTOPAR_* below",
                f"  bash launch.sh --autopar-runtime [ARGS...]   autopar's runtime: python -m {LAUNCH_MODULE} {PLAN_FILE}",
                f"The plan is written to $AUTOPAR_PLAN (default {PLAN_FILE}) before the launch.",
            ]
        ),
        comment_block(notes_lines("torchrun", lost)),
        "set -euo pipefail",
        "if [[ $# -lt 1 ]]; then",
        "    echo 'usage: launch.sh TRAIN_SCRIPT [ARGS...] | launch.sh --autopar-runtime [ARGS...]' >&2",
        "    exit 2",
        "fi",
        ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"',
        f'MASTER_PORT="${{MASTER_PORT:-{RDZV_PORT}}}"',
        f'RDZV_ID="${{RDZV_ID:-{_rdzv_id(job)}}}"',
        f'export AUTOPAR_PLAN="${{AUTOPAR_PLAN:-{PLAN_FILE}}}"',
        *env_lines,
        f"cat > \"$AUTOPAR_PLAN\" <<'{_PLAN_DELIMITER}'",
        plan_json,
        _PLAN_DELIMITER,
        'if [[ "$1" == --autopar-runtime ]]; then',
        "    shift",
        f'    exec {head} \\\n    -m {LAUNCH_MODULE} "$AUTOPAR_PLAN" "$@"',
        "fi",
        f'exec {head} \\\n    "$@"',
    ]
    return ExportResult("\n".join(lines) + "\n", "launch.sh", lost, "text/x-shellscript")
