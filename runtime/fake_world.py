"""Memory of a layout at its planned world size, without the GPUs: a fake process group and fake
tensors (docs/architecture.md "How we verify without a GPU" 2; docs/verification-notes.md "Memory").

For one simulated rank of each pipeline stage (the first rank of the stage: all coordinates 0 but
`pp`), this process joins a `fake` process group of `layout.world_size` ranks, builds the meshes,
builds the model inside `FakeTensorMode`, parallelizes it outside the mode (DeviceMesh and FSDP2
cannot be set up inside it), then runs `steps` training steps inside the mode under the
live-storage tracker (`runtime.memory`). The peak of the steps, after the model is built, is
what the runtime would allocate on that rank: parameters, gradients, optimizer states,
activations, logits and the communication buffers torch allocates (FSDP all-gather /
reduce-scatter, all-to-all, pipeline send/receive), without the CUDA caching allocator's rounding
and NCCL's own buffers.

Workarounds (torch 2.13): DTensor must not reuse the outer fake mode for sharding propagation
(`_sharding_prop.detect_fake_mode` is patched to return None while tracing), pipeline stages get
static shapes, and expert parallelism routes tokens evenly (the data-dependent routing cannot run
on fake tensors; `MoE.tokens_per_expert` does the same).

    python -m runtime.fake_world RUNSPEC_OR_PLAN.json [--cluster dgx-h100] [--steps 2] [--dtype bf16]

prints, per stage, the measured peak next to `cost_models.estimate.estimate(...).memory` and
writes JSON with `--out`.

Host memory of the build (`measure_build`, `--build`): the same simulated rank builds its model
parts for real, as `runtime.train` does (the whole model on the meta device, cut and sharded
there, then `to_empty` on the CPU and seeded values in the local shards only), and reports the
bytes of its parameter shards beside the growth of the process's peak resident memory during the
build (VmHWM, reset first through /proc/self/clear_refs) and the whole model's float32 bytes, which
every rank built before sharding until the runtime built on meta. Only the shards are real memory
here, so a 70B or 405B plan's rank fits one CPU host when its shard does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime.memory import LiveStorageTracker
from runtime.spec import RunSpec, load_run_spec, traced_layout

__all__ = [
    "BUILD_HEADER", "TABLE_HEADER", "BuildMemory", "StageMemory", "compare_with_estimate", "format_build", "format_row",
    "measure_build", "measure_builds", "measure_stage", "measure_stages", "relative_error", "traced_layout",
]


@dataclass
class BuildMemory:
    stage: int
    rank: int
    local_bytes: int  # the rank's parameter shards as materialised (tensor bytes)
    model_bytes: int  # the whole model in float32: what every rank built before sharding, formerly
    rss_growth_bytes: int  # peak resident memory during the build less the resident memory before it
    seconds: float


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def measure_build(run: RunSpec, stage: int) -> BuildMemory:
    """Build the parts of the first rank of pipeline stage `stage` for real on the CPU (module doc)."""
    from model_specs.params import count_params
    from runtime.mesh import build_meshes
    from runtime.parallelize import build_parts
    from runtime.weights import local_box

    rank = stage_rank(run, stage)
    with _fake_group(rank, run.layout.world_size):
        meshes = build_meshes(run.layout, "cpu")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident memory (proc(5))
        before = _status_kib("VmRSS")
        t0 = time.perf_counter()
        parts = build_parts(run, meshes, torch.device("cpu"))
        seconds = time.perf_counter() - t0
        peak = _status_kib("VmHWM")
        local = 0
        for chunk in parts.chunks:
            for p in chunk.parameters():
                t = local_box(p)[0]
                local += t.numel() * t.element_size()
    return BuildMemory(stage, rank, local, 4 * count_params(run.model).total, 1024 * (peak - before), seconds)


def measure_builds(run: RunSpec, stages: list[int] | None = None) -> list[BuildMemory]:
    """`measure_build` of each stage (default all), each in a fresh Python process."""
    out = []
    for stage in range(run.layout.pp) if stages is None else stages:
        proc = subprocess.run(
            [sys.executable, "-m", "runtime.fake_world", "--child", str(stage), "--build", "-"],
            input=run.model_dump_json(), capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"build of stage {stage} failed:\n{proc.stderr[-6000:]}")
        out.append(BuildMemory(**json.loads(proc.stdout.strip().splitlines()[-1])))
    return out


BUILD_HEADER = f"{'stage':>5s} {'rank':>6s} {'shard GiB':>10s} {'RSS growth GiB':>15s} {'model fp32 GiB':>15s} {'s':>6s}"
"""Column names of `format_build`."""


def format_build(b: BuildMemory) -> str:
    gib = 2**30
    return (f"{b.stage:5d} {b.rank:6d} {b.local_bytes / gib:10.3f} {b.rss_growth_bytes / gib:15.3f} "
            f"{b.model_bytes / gib:15.1f} {b.seconds:6.1f}")


@dataclass
class StageMemory:
    stage: int
    rank: int
    peak_bytes: int  # peak over the traced steps
    steady_bytes: int  # live bytes between steps (parameters, gradients?, optimizer states)
    seconds: float


@contextlib.contextmanager
def _no_dtensor_fake_reuse() -> Iterator[None]:
    import torch.distributed.tensor._sharding_prop as sp

    orig = sp.detect_fake_mode
    sp.detect_fake_mode = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        sp.detect_fake_mode = orig  # type: ignore[assignment]


@contextlib.contextmanager
def _fake_group(rank: int, world: int) -> Iterator[None]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def stage_rank(run: RunSpec, stage: int) -> int:
    """Global rank of the first rank of pipeline stage `stage` (all other coordinates 0)."""
    from cost_models.mesh import mesh_strides

    return stage * mesh_strides(run.layout).pp


def measure_stage(run: RunSpec, stage: int, steps: int = 2) -> StageMemory:
    """Trace `steps` training steps of the first rank of pipeline stage `stage` (module doc)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runtime.mesh import build_meshes
    from runtime.train import Trainer

    t0 = time.perf_counter()
    rank = stage_rank(run, stage)
    lay = run.layout
    device = torch.device("cpu")
    with _fake_group(rank, lay.world_size), _no_dtensor_fake_reuse():
        meshes = build_meshes(lay, "cpu")
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        trainer = Trainer(run, device, meshes=meshes, fake_mode=fake)
        tracker = LiveStorageTracker()
        rows = lay.grad_accum_ * lay.micro_batch
        s_local = run.training.seq_len // lay.cp
        steady = 0
        with fake, tracker:
            for m in trainer.parts.chunks:
                tracker.track(m)
            tracker.reset_peak()
            for _ in range(steps):
                tokens = torch.zeros(rows, s_local, dtype=torch.long)
                trainer.train_step((tokens, tokens.clone()))
                steady = tracker.live_bytes
        return StageMemory(stage, rank, tracker.peak_bytes, steady, time.perf_counter() - t0)


def measure_stages(run: RunSpec, steps: int = 2, isolate: bool = True) -> list[StageMemory]:
    """`measure_stage` for every pipeline stage, each in a fresh Python process by default: torch
    caches DTensor redistribution plans and process-group names across process groups, so a
    second fake world in one process can trip over the first one's (stale group names)."""
    if not isolate:
        return [measure_stage(run, s, steps) for s in range(run.layout.pp)]
    out = []
    for stage in range(run.layout.pp):
        proc = subprocess.run(
            [sys.executable, "-m", "runtime.fake_world", "--child", str(stage), "--steps", str(steps), "-"],
            input=run.model_dump_json(),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"fake-world trace of stage {stage} failed:\n{proc.stderr[-6000:]}")
        out.append(StageMemory(**json.loads(proc.stdout.strip().splitlines()[-1])))
    return out


def compare_with_estimate(
    run: RunSpec, measured: list[StageMemory], cluster: str = "dgx-h100", framework: str = "fsdp"
) -> list[dict[str, Any]]:
    """Rows of stage, measured peak and the cost model's breakdown for that stage, the layout priced
    as the trace executes it (`traced_layout`). The compared estimate leaves out what a CPU trace
    cannot hold: the allocator reserve (CUDA context, fragmentation) and NCCL's buffers."""
    from cluster_specs.presets import get_cluster
    from cost_models.calibration import default_calibration
    from cost_models.estimate import estimate

    layout = traced_layout(run, framework)
    est = estimate(run.model, run.training, get_cluster(cluster), run.gpus, layout, run.stage_partition)
    nccl = est.layout.communicator_groups * default_calibration().nccl_buffer_bytes_per_group  # GPU-only
    rows = []
    for m in measured:
        b = est.memory[m.stage]
        modelled = b.total - b.reserve - nccl
        rows.append(
            {
                **asdict(m),
                "estimate": b.as_dict(),
                "estimate_without_reserve_bytes": int(modelled),
                "ratio_measured_to_estimate": m.peak_bytes / modelled if modelled else None,
            }
        )
    return rows


TABLE_HEADER = f"{'stage':>5s} {'rank':>6s} {'measured GiB':>13s} {'estimate GiB':>13s} {'error':>7s} {'s':>6s}"
"""Column names of `format_row`."""


def relative_error(row: dict[str, Any]) -> float:
    """(estimate - measured) / measured of a `compare_with_estimate` row."""
    return row["estimate_without_reserve_bytes"] / row["peak_bytes"] - 1


def format_row(row: dict[str, Any]) -> str:
    """One `compare_with_estimate` row under `TABLE_HEADER` (GiB = 2**30 bytes; seconds traced)."""
    gib = 2**30
    return (
        f"{row['stage']:5d} {row['rank']:6d} {row['peak_bytes'] / gib:13.3f} "
        f"{row['estimate_without_reserve_bytes'] / gib:13.3f} {100 * relative_error(row):+6.1f}% {row['seconds']:6.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.fake_world", description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="RunSpec or Plan JSON")
    p.add_argument("--cluster", default="dgx-h100", help="cluster preset for the estimate")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="bf16")
    p.add_argument("--out", default=None)
    p.add_argument("--build", action="store_true", help="host memory of each stage's build (measure_build)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child is not None:  # one stage, RunSpec JSON on stdin, StageMemory / BuildMemory JSON on stdout
        run = RunSpec.model_validate_json(sys.stdin.read())
        torch.set_num_threads(1)
        result = measure_build(run, a.child) if a.build else measure_stage(run, a.child, a.steps)
        print(json.dumps(asdict(result)))
        return 0
    run = load_run_spec(a.spec, dtype=a.dtype)
    if a.build:
        builds = measure_builds(run)
        print(BUILD_HEADER, file=sys.stderr)
        for b in builds:
            print(format_build(b), file=sys.stderr)
        if a.out:
            with open(a.out, "w") as f:
                json.dump([asdict(b) for b in builds], f, indent=2)
        return 0
    rows = compare_with_estimate(run, measure_stages(run, a.steps), a.cluster)
    print(TABLE_HEADER, file=sys.stderr)
    for r in rows:
        print(format_row(r), file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
