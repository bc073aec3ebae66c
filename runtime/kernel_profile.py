"""`autopar profile`'s measurements: the atlas entries a plan looks up, timed on this machine's device.

Input: the lookups pricing a plan makes (`cost_models.kernels.record.Lookups`, from
`planner.kernel_profile.plan_needs`). Output: an atlas document (`cost_models.kernels.schema`,
format ``autopar-kernel-atlas/1``) with a `provenance` (device as torch names it, UTC time, command,
torch / CUDA versions, host) that `read_atlas_file` accepts and the service stores per cluster.

How each entry is timed (method ``queued`` of the schema: the mean of back-to-back calls, so the GPU
never waits for the host): 3 warm-up calls, then three timed runs of r calls each, r chosen so a
run lasts about `RUN_SECONDS` (1 to 200 calls); the median run's time per call. CUDA events
bracket a run on a GPU, `time.perf_counter` on the CPU (after a synchronize).

- GEMM (m, n, k, bf16): ``a @ b``, a (m x k), b (k x n), random normal data, as
  `data/measurements/h200-2026-11/kernel_rates.py` times them; fp8: ``torch._scaled_mm`` of e4m3
  inputs with unit scales into bf16 (needs a GPU with FP8 tensor cores, dimensions multiple of 16).
- Attention (kernel, head dim d, length s, mask): ``F.scaled_dot_product_attention`` in bf16 with
  `ATTENTION_HEADS` heads and a batch of `ATTENTION_TOKENS` // s sequences (the H200 measurements'
  32 heads and 16,384 tokens), restricted to torch's backend of the kernel (flash2: FLASH_ATTENTION,
  cudnn: CUDNN_ATTENTION); the forward and the forward + backward are timed and written as passes
  ``fwd`` and ``fwd_bwd``, from which the atlas derives the backward
  (`cost_models.kernels.attention`). FLOPs: 4 b h s^2 d forward, half under a causal mask, 3.5x for
  forward + backward (the schema's convention). FlashAttention-3 / -4 are not reachable through
  torch and are skipped, saying so.
- On the CPU every entry is timed as the runtime runs on a CPU (`runtime.parallelize.compute_dtype`,
  `runtime.launch --threads`): in float32 on one thread, torch's CPU attention standing in for every
  kernel, with fewer heads and tokens (`CPU_HEADS`, `CPU_TOKENS`); the file says so (its GEMM
  points keep the atlas's dtype names, so they price the plan's lookups).
- Memory: one copy of `COPY_BYTES` (bytes read + written per second), which prices every
  memory-bound kernel of the plan (`KernelAtlas.memory_bandwidth`).
- Collectives are listed but not timed: one process cannot (the agent's `--preflight` measures its
  node's all-reduce bus bandwidth).

Entries are timed smallest first until `max_seconds` have passed, and a GEMM that could not be
timed in the time left even at the best rate measured so far is skipped before it starts; what is
skipped is listed on stderr, with the reason, and counted in the file's description.
"""

from __future__ import annotations

import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import torch
import torch.nn.functional as F

RUN_SECONDS = 0.02
CALLS_PER_ENTRY = 8
"""Calls an entry's timing makes at least (3 warm-up, 1 sizing, 3 runs of one or more, and slack)."""
ATTENTION_HEADS = 32
ATTENTION_TOKENS = 16384
CPU_HEADS = 4
CPU_TOKENS = 512
COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 24}
SDPA_BACKENDS = {"flash2": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}

Progress = Callable[[int, int, str], None]


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    """The device as torch names it (`torch.cuda.get_device_name`), or ``cpu (<processor>)``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds per call of `fn`, the median of three back-to-back runs (module doc)."""
    for _ in range(3):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    once = max(time.perf_counter() - t0, 1e-7)
    reps = int(min(200, max(1, RUN_SECONDS / once)))
    runs = []
    for _ in range(3):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) / 1e3 / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            runs.append((time.perf_counter() - t0) / reps)
    return statistics.median(runs)


def gemm_seconds(m: int, n: int, k: int, dtype: str, device: torch.device) -> float:
    """Seconds of one GEMM (module doc); a ValueError when the device cannot run `dtype`."""
    if dtype == "fp8":
        if device.type != "cuda" or not hasattr(torch, "float8_e4m3fn") or torch.cuda.get_device_capability(device) < (8, 9):
            raise ValueError("fp8 GEMMs need a GPU with FP8 tensor cores (compute capability 8.9+)")
        if m % 16 or n % 16 or k % 16:
            raise ValueError("torch._scaled_mm needs dimensions that are multiples of 16")
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        return time_call(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device)
    a = torch.randn(m, k, device=device, dtype=compute_dtype(device))
    b = torch.randn(k, n, device=device, dtype=compute_dtype(device))
    return time_call(lambda: a @ b, device)


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU; float32 on the CPU, as the runtime computes there (module doc)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def attention_rates(kernel: str, d: int, s: int, causal: bool, device: torch.device) -> tuple[float, float, int, int]:
    """(forward TFLOP/s, forward + backward TFLOP/s, batch, heads) of one SDPA shape (module doc)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, tokens = (ATTENTION_HEADS, ATTENTION_TOKENS) if device.type == "cuda" else (CPU_HEADS, CPU_TOKENS)
    batch = max(1, tokens // s)
    shape = (batch, heads, s, d)
    dtype = compute_dtype(device)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=dtype)
    if device.type == "cuda":
        if kernel not in SDPA_BACKENDS:
            raise ValueError(f"attention kernel {kernel} is not one of torch's SDPA backends ({', '.join(SDPA_BACKENDS)})")
        backends = [getattr(SDPBackend, SDPA_BACKENDS[kernel])]
    else:
        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]

    def fwd() -> Any:
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd() -> None:
        out = fwd()
        torch.autograd.backward(out, grad)

    with torch.no_grad():
        t_fwd = time_call(fwd, device)
    t_both = time_call(fwd_bwd, device)
    flops = 4.0 * batch * heads * s * s * d * (0.5 if causal else 1.0)
    return flops / t_fwd / 1e12, 3.5 * flops / t_both / 1e12, batch, heads


def copy_gb_per_s(device: torch.device) -> float:
    """Bytes read + written per second (1e9) of one device-to-device copy (module doc)."""
    nbytes = COPY_BYTES["cuda" if device.type == "cuda" else "cpu"]
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2.0 * nbytes / time_call(lambda: dst.copy_(src), device) / 1e9


def _gemm_cost(key: tuple) -> float:
    return float(key[0]) * key[1] * key[2]


def profile(
    needs: Any, gpu: str, *, device: torch.device | None = None, max_seconds: float = 300.0,
    command: list[str] | None = None, progress: Progress | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Time `needs` (a `Lookups`) on `device` (default: the GPU, else the CPU) within `max_seconds`;
    the atlas document of the measured points (module doc). `gpu` is the catalog GPU the points are
    of; on the CPU it must be the catalog's ``cpu``. Returns the document and the entries skipped,
    each with its reason."""
    device = device or default_device()
    cuda = device.type == "cuda"
    name = device_name(device)
    software = f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}" if cuda and torch.version.cuda else "")
    tasks: list[tuple[str, tuple, float]] = [("memory", ("copy",), 0.0)]
    tasks += [("gemm", key, _gemm_cost(key)) for key in needs.gemm]
    fwd_keys = sorted({(kern, d, s, causal) for kern, d, s, causal, _ in needs.attention})
    tasks += [("attention", key, float(key[2]) ** 2 * key[1]) for key in fwd_keys]
    tasks.sort(key=lambda t: (t[0] != "memory", t[2]))
    total = len(tasks) + len(needs.collectives)
    out: dict[str, list[dict[str, Any]]] = {"gemm": [], "attention": [], "memory": []}
    skipped: list[str] = [f"{op} {span} {ranks} ranks {nb} B: collectives are not timed by one process"
                          for op, span, ranks, _nodes, nb in sorted(needs.collectives)]
    start = time.monotonic()
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        _measure(tasks, total, device, max_seconds, start, out, skipped, progress)
    finally:
        torch.set_num_threads(threads)
    measured = sum(len(v) for v in out.values())
    where = (name if cuda else "the CPU (float32 on one thread, as the runtime runs there; torch's CPU kernels "
             "stand for the GPU kernels named)")
    cmd = shlex.join(command if command is not None else sys.argv)
    return {
        "format": "autopar-kernel-atlas/1",
        "gpu": gpu,
        "description": (f"Measured by autopar profile on {where}: {measured} points for the "
                        f"{len(needs)} kernel lookups a plan makes; {len(skipped)} skipped"
                        + (f" ({'; '.join(skipped[:5])}{'; ...' if len(skipped) > 5 else ''})" if skipped else "")
                        + "."),
        "provenance": {"device": name, "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                       "command": cmd, "software": software, "host": platform.node()},
        "sources": {"profile": {
            "citation": f"autopar profile on {name}: {cmd}"[:2000], "method": "queued", "software": software,
        }},
        **out,
    }, skipped


def _measure(tasks: list[tuple[str, tuple, float]], total: int, device: torch.device, max_seconds: float,
             start: float, out: dict[str, list[dict[str, Any]]], skipped: list[str], progress: Progress | None) -> None:
    """Time `tasks` in order into `out` until `max_seconds` after `start` (module doc). An entry
    whose timing would take longer than the budget left even at the fastest GEMM rate measured so
    far (`CALLS_PER_ENTRY` calls: a lower bound of its time) is skipped before it starts."""
    best: float | None = None  # FLOP/s, the highest any GEMM of this profile reached
    for i, (kind, key, _) in enumerate(tasks, 1):
        label = f"{kind} {' '.join(str(x) for x in key)}"
        left = max_seconds - (time.monotonic() - start)
        if left <= 0:
            skipped.append(f"{label}: over --max-seconds {max_seconds:g}")
            continue
        flops = 2.0 * key[0] * key[1] * key[2] if kind == "gemm" else 0.0
        if best and flops and CALLS_PER_ENTRY * flops / best > left:
            skipped.append(f"{label}: about {CALLS_PER_ENTRY * flops / best:.0f} s to time, over the "
                           f"{left:.0f} s left of --max-seconds {max_seconds:g}")
            continue
        if progress:
            progress(i, total, label)
        try:
            if kind == "memory":
                out["memory"].append({"op": "copy", "gb_per_s": copy_gb_per_s(device), "source": "profile"})
            elif kind == "gemm":
                m, n, k, dtype = key
                t = gemm_seconds(m, n, k, dtype, device)
                best = max(best or 0.0, 2.0 * m * n * k / t)
                out["gemm"].append({"m": m, "n": n, "k": k, "dtype": dtype, "seconds": t, "source": "profile"})
            else:
                kern, d, s, causal = key
                fwd, both, batch, heads = attention_rates(kern, d, s, causal, device)
                for pass_, tflops in (("fwd", fwd), ("fwd_bwd", both)):
                    out["attention"].append({"kernel": kern, "head_dim": d, "seq_len": s, "causal": causal,
                                             "pass": pass_, "tflops": tflops, "source": "profile",
                                             "batch": batch, "heads": heads})
        except (ValueError, RuntimeError) as exc:  # a shape or dtype this device or torch cannot run
            skipped.append(f"{label}: {str(exc).splitlines()[0][:200]}")
        if device.type == "cuda":
            torch.cuda.empty_cache()


def load_plan(data: dict[str, Any]) -> Any:
    """A Plan from `autopar plan --json`'s output or the service's plan record (its ``plan``)."""
    from planner.plan import Plan

    if "inputs" not in data and isinstance(data.get("plan"), dict):
        data = data["plan"]
    return Plan.model_validate(data)


def profile_plan(
    plan: Any, *, device: torch.device | None = None, max_seconds: float = 300.0, command: list[str] | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The atlas document of `plan`'s kernel lookups (`planner.kernel_profile.plan_needs`) timed on
    `device` (`profile`): of the plan's GPU on a GPU, of the catalog's ``cpu`` on the CPU."""
    from planner.kernel_profile import plan_needs

    device = device or default_device()
    needs = plan_needs(plan)
    gpu = plan.inputs.cluster.gpu.name if device.type == "cuda" else "cpu"
    return profile(needs, gpu, device=device, max_seconds=max_seconds, command=command, progress=progress)


def stderr_progress(i: int, total: int, label: str) -> None:
    print(f"[{i}/{total}] {label}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m runtime.kernel_profile PLAN --out FILE``: what `autopar profile PLAN` and the
    agent's profiling step run (a JSON error line and exit code 2 on a plan it cannot read)."""
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m runtime.kernel_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("plan", help="Plan JSON (autopar plan --json, or the service's plan record)")
    p.add_argument("--out", required=True, help="atlas JSON written here")
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    a = p.parse_args(argv)
    try:
        plan = load_plan(json.loads(Path(a.plan).read_text()))
    except (OSError, ValueError) as exc:
        print(f"error: {a.plan}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    device = default_device() if a.device == "auto" else torch.device(a.device)
    doc, skipped = profile_plan(plan, device=device, max_seconds=a.max_seconds, command=["python", "-m",
                                "runtime.kernel_profile", *(argv if argv is not None else sys.argv[1:])],
                                progress=stderr_progress)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for line in skipped:
        print(f"skipped: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
