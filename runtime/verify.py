"""Run several RunSpecs in one distributed job and dump what they computed, for comparison with a
single-process run (the runtime's execution tests, docs/architecture.md "How we verify without a GPU" 3).

    torchrun --standalone --nproc_per_node=4 -m runtime.verify CASES.json OUTDIR

CASES.json is a list of `{"name": str, "run": RunSpec dict, "steps": int, "resume_at": int?}`.
Cases run one after another in the same process group (start-up is most of a small job's cost).
Each rank writes `OUTDIR/<name>/rank<r>.pt` (or `rank<r>.error` with the traceback): `{"losses": [...], "params": {name: full tensor} of
the parameters its pipeline chunks hold, "peak_memory_bytes": int | None, "seconds": float}`.
With `resume_at = k`, the case trains k steps, saves a distributed checkpoint, builds a fresh
trainer from it and trains to `steps`; `losses` then holds steps k..steps-1 of the resumed job.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime.spec import load_run_spec
from runtime.train import Trainer, init_distributed, train


def run_case(case: dict[str, Any], out_dir: Path, track_memory: bool = False) -> None:
    t0 = time.perf_counter()
    run = load_run_spec(case["run"])
    steps = int(case.get("steps", run.steps))
    device = init_distributed(run)
    rank = dist.get_rank() if dist.is_initialized() else 0
    params: dict[str, torch.Tensor] = {}

    def grab(trainer: Trainer) -> None:
        params.update(trainer.full_parameters())

    resume_at = case.get("resume_at")
    if resume_at is not None:
        tmp = None
        if rank == 0:
            tmp = tempfile.mkdtemp(prefix="autopar-ckpt-")
        holder = [tmp]
        if dist.is_initialized():
            dist.broadcast_object_list(holder, src=0)
        ckpt = Path(holder[0])  # type: ignore[arg-type]
        try:
            train(run, steps=int(resume_at), checkpoint_dir=ckpt, device=device)
            res = train(run, steps=steps, checkpoint_dir=ckpt, device=device, trainer_hook=grab)
        finally:
            if dist.is_initialized():
                dist.barrier()
            if rank == 0:
                shutil.rmtree(ckpt, ignore_errors=True)
    else:
        res = train(run, steps=steps, device=device, trainer_hook=grab, track_memory=track_memory)
    dest = out_dir / case["name"]
    dest.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "losses": res.losses,
            "params": params,
            "peak_memory_bytes": res.peak_memory_bytes,
            "seconds": time.perf_counter() - t0,
            "start_step": res.start_step,
        },
        dest / f"rank{rank}.pt",
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m runtime.verify CASES.json OUTDIR")
    torch.set_num_threads(1)
    cases = json.loads(Path(args[0]).read_text())
    out = Path(args[1])
    try:
        for case in cases:
            try:
                run_case(case, out, track_memory=bool(case.get("track_memory", False)))
            except Exception as exc:  # record it and go on (a failure on every rank leaves the
                # group usable; one on some ranks only hangs the others until the launcher's timeout)
                rank = dist.get_rank() if dist.is_initialized() else 0
                dest = out / case["name"]
                dest.mkdir(parents=True, exist_ok=True)
                (dest / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
