"""Run several RunSpecs in one distributed job and dump what they computed, for comparison with a
single-process run (the runtime's execution tests, docs/architecture.md "How we verify without a GPU" 3).

    torchrun --standalone --nproc_per_node=4 -m runtime.verify CASES.json OUTDIR

CASES.json is a list of `{"name": str, "run": RunSpec dict, "steps": int, "resume_at": int?}`.
Cases run one after another in the same process group (start-up is most of a small job's cost).
Each rank writes `OUTDIR/<name>/rank<r>.pt` (or `rank<r>.error` with the traceback): `{"losses": [...], "params": {name: full tensor} of
the parameters its pipeline chunks hold, "peak_memory_bytes": int | None, "seconds": float}`.
With `resume_at = k`, the case trains k steps, saves a distributed checkpoint, builds a fresh
trainer from it and trains to `steps`; `losses` then holds steps k..steps-1 of the resumed job.
With `logits = {"seed": s, "batch": b}`, the case trains nothing: it builds the model (from the
run's `hf_checkpoint`, say) and writes the logits of b sequences of seq_len tokens drawn from seed
s (`"logits"`: (b, seq_len, vocab) on the ranks of the last pipeline stage, None elsewhere).

From a test: `launch(cases, nproc, out_dir)` runs such a job under torchrun (gloo, one CPU thread
per rank) and `load_results(out_dir, name, nproc)` reads one case back (raising on a rank error).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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


def forward_logits(trainer: Trainer, tokens: torch.Tensor) -> torch.Tensor | None:
    """Logits of `tokens` (B, S) through this rank's chunks, without a schedule: each pipeline
    chunk receives its input from the rank of the previous one and sends its output on (point to
    point over the pp group). Full-vocabulary logits on the last stage's ranks, None elsewhere."""
    parts, meshes = trainer.parts, trainer.meshes
    placement = trainer.run.stage_partition.chunk_ranks
    group = meshes["pp"].get_group() if trainer.run.layout.pp > 1 else None
    b, s = tokens.shape
    hidden = (b, s, trainer.run.model.hidden_size)
    out = None
    with torch.no_grad():
        for c in range(parts.num_chunks):
            if c not in parts.chunk_ids:
                continue
            chunk = parts.chunks[parts.chunk_ids.index(c)]
            if c == 0:
                x = tokens
            elif placement[c - 1] == placement[c]:
                x = out
            else:
                x = torch.empty(hidden, dtype=trainer.dtype)
                dist.recv(x, src=dist.get_global_rank(group, placement[c - 1]), group=group)
            y = chunk(x)
            if c == parts.num_chunks - 1:
                return y.full_tensor() if hasattr(y, "full_tensor") else y
            if placement[c + 1] != placement[c]:
                dist.send(y.contiguous(), dst=dist.get_global_rank(group, placement[c + 1]), group=group)
            out = y
    return None


def run_case(case: dict[str, Any], out_dir: Path, track_memory: bool = False) -> None:
    t0 = time.perf_counter()
    run = load_run_spec(case["run"])
    steps = int(case.get("steps", run.steps))
    device = init_distributed(run)
    rank = dist.get_rank() if dist.is_initialized() else 0
    params: dict[str, torch.Tensor] = {}
    if "logits" in case:
        g = torch.Generator().manual_seed(int(case["logits"]["seed"]))
        tokens = torch.randint(0, run.model.vocab_size, (int(case["logits"]["batch"]), run.training.seq_len), generator=g)
        logits = forward_logits(Trainer(run, device), tokens)
        dest = out_dir / case["name"]
        dest.mkdir(parents=True, exist_ok=True)
        torch.save({"logits": logits, "seconds": time.perf_counter() - t0}, dest / f"rank{rank}.pt")
        return

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


def launch(cases: list[dict[str, Any]], nproc: int, out_dir: Path, timeout_s: float = 900) -> subprocess.CompletedProcess:
    """Run `cases` in one `torchrun --standalone --nproc_per_node=nproc -m runtime.verify` job
    writing under `out_dir` (the cases file goes beside it). Returns the finished process (its
    return code is non-zero only when a process died: Python errors are recorded per case)."""
    root = Path(__file__).resolve().parents[1]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    cases_file = out_dir.parent / f"{out_dir.name}.cases.json"
    cases_file.write_text(json.dumps(cases))
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1",
        "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "runtime.verify", str(cases_file), str(out_dir),
    ]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)


def load_results(out_dir: Path, name: str, nproc: int) -> list[dict[str, Any]]:
    """The per-rank results of case `name` (rank order); RuntimeError with the first rank's
    traceback when a rank recorded an error, or when a rank wrote nothing."""
    d = out_dir / name
    errors = sorted(d.glob("rank*.error"))
    if errors:
        raise RuntimeError(f"{name} failed:\n{errors[0].read_text()}")
    files = sorted(d.glob("rank*.pt"), key=lambda f: int(f.stem[4:]))
    if len(files) != nproc:
        raise RuntimeError(f"{name}: {len(files)} of {nproc} rank results")
    return [torch.load(f, weights_only=False) for f in files]


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
