"""Entry point: run a RunSpec or a Plan under torchrun and write a Profile JSON.

    torchrun --nproc_per_node=G -m runtime.launch PLAN_OR_RUNSPEC.json --steps N --out profile.json

Options: `--checkpoint-dir D` (resume from D if it holds a checkpoint; save there at the end),
`--hf-checkpoint H` (start from the weights of the HuggingFace checkpoint in H: config.json and
model.safetensors or its sharded index; each rank reads only its slices, runtime.checkpoint),
`--peak-flops F` (per-GPU peak FLOP/s for MFU; default the plan's cluster GPU, or `--gpu NAME`
from the catalog at the training precision), `--seed`, `--lr`, `--warmup-steps`, `--dtype`,
`--backend`, `--no-track-memory` (skip the CPU live-storage tracker), `--threads` (CPU threads per
rank, default 1 on CPU), `--progress-file P` (rank 0 rewrites P after every step with
{"step", "steps", "loss", "step_s"}: the runner agent's progress source).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from runtime.spec import load_run_spec
from runtime.train import init_distributed, make_profile, train, write_profile


def _gpu_peak(name: str, precision: str) -> float:
    from cluster_specs.catalog import get_gpu

    return get_gpu(name).peak(precision)


def _fmt(value: float | None, spec: str) -> str:
    """A figure rounded for the end-of-run line ("n/a" when the run measured none)."""
    return "n/a" if value is None else format(value, spec)


def _max(values: list) -> float | None:  # type: ignore[type-arg]
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _gib(value: float | None) -> float | None:
    return None if value is None else value / 2**30


def _progress_writer(path: str):  # type: ignore[no-untyped-def]
    """A step callback that atomically replaces `path` with the progress of the run."""

    def write(step: int, steps: int, loss: float, step_s: float) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "steps": steps, "loss": loss, "step_s": step_s}, f)
        os.replace(tmp, path)

    return write


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # a torchrun worker: die with torchrun (agent/launcher.py)
        from runtime.process import set_parent_death_signal

        set_parent_death_signal()
    p = argparse.ArgumentParser(prog="python -m runtime.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="RunSpec or Plan JSON")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--out", default="profile.json", help="Profile JSON path (written by rank 0)")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--hf-checkpoint", default=None,
                   help="HuggingFace checkpoint directory the weights start from (config.json + safetensors)")
    p.add_argument("--peak-flops", type=float, default=None, help="per-GPU peak FLOP/s for MFU")
    p.add_argument("--gpu", default=None, help="catalog GPU whose peak to use for MFU")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup-steps", type=int, default=None)
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default=None)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default=None)
    p.add_argument("--no-track-memory", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--data", default=None, help="tokenized data: flat binary file of token ids")
    p.add_argument("--data-dtype", default=None, choices=["uint16", "uint32", "int32", "int64"])
    p.add_argument("--progress-file", default=None, help="JSON progress rewritten by rank 0 after every step")
    a = p.parse_args(argv)

    run = load_run_spec(
        a.spec, steps=a.steps, seed=a.seed, lr=a.lr, warmup_steps=a.warmup_steps, dtype=a.dtype, backend=a.backend,
        data_path=a.data, data_dtype=a.data_dtype, hf_checkpoint=a.hf_checkpoint,
    )
    peak = a.peak_flops
    if peak is None and a.gpu:
        peak = _gpu_peak(a.gpu, run.training.precision)
    device = init_distributed(run)
    if device.type == "cpu":
        torch.set_num_threads(a.threads or 1)
    on_step = None
    if a.progress_file and (not dist.is_initialized() or dist.get_rank() == 0):
        on_step = _progress_writer(a.progress_file)
    try:
        res = train(
            run, checkpoint_dir=a.checkpoint_dir, track_memory=not a.no_track_memory, device=device, on_step=on_step
        )
        profile = make_profile(run, res, device, peak)
        if not dist.is_initialized() or dist.get_rank() == 0:
            write_profile(profile, a.out)
            last = f"{res.losses[-1]:.4f}" if res.losses else "n/a"
            print(
                f"autopar runtime: {len(res.losses)} steps, final loss {last}, "
                f"step {_fmt(profile['step_s'], '.3f')} s, tokens/s {_fmt(profile['tokens_per_s'], ',.0f')}, "
                f"start-up {_fmt(_max(profile['startup_s_per_rank']), '.1f')} s, "
                f"host peak RSS {_fmt(_gib(_max(profile['host_peak_rss_bytes_per_rank'])), '.2f')} GiB "
                f"(max over ranks), profile -> {a.out}",
                file=sys.stderr,
            )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
