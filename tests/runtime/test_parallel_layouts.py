"""Real multi-process runs of the runtime's layouts on gloo, checked against one process.

One `torchrun --standalone --nproc_per_node=4 -m runtime.verify` job runs every case below in turn
(one start-up, ~5 s, instead of one per case); each test then compares one case with a single-process
run of the same model, seed, data and optimizer, computed here in-process.

Tolerances (fp32 throughout; the parallel runs reorder sums, so last bits differ):
- losses: relative 1e-5 (measured: <= 1.6e-7);
- final parameters after SGD steps: absolute 1e-5 (measured: <= 3e-7);
- final parameters after AdamW steps: absolute 2e-4. Adam divides by sqrt(v) + eps, so where a
  gradient is near eps a last-bit difference moves the update by up to lr (1e-3 here); measured
  <= 4e-5. SGD cases carry the tight parameter check; AdamW cases check that sharded optimizer
  state is right at all.
- a checkpoint resumed under the same layout gives bit-identical losses to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from cost_models.pipeline import FORWARDS_FIRST_SCHEDULES

torch = pytest.importorskip("torch")

from runtime.spec import load_run_spec  # noqa: E402
from runtime.train import train  # noqa: E402

# scripts/test.sh distributes whole files over the xdist workers (--dist loadfile), so the
# module-scoped 4-process job starts once, not once per worker
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NPROC = 4
STEPS = 3
LOSS_RTOL = 1e-5
SGD_ATOL = 1e-5
ADAMW_ATOL = 2e-4


def _variant(**changes: Any) -> dict[str, Any]:
    """The tiny preset with some ModelSpec fields changed (features the presets lack)."""
    from model_specs.presets import get_model

    return {**get_model("tiny").model_dump(mode="json"), "name": "tiny-variant", **changes}


QK_NORM = _variant(qk_norm=True)
GPT2_LIKE = _variant(
    family="gpt2", mlp="gelu", norm="layernorm", qkv_bias=True, attn_out_bias=True, mlp_bias=True,
    tie_embeddings=True, position_embedding="learned", max_position_embeddings=64, num_kv_heads=None,
)
SINKS_WINDOW = _variant(attention_sinks=True, sliding_window=8, sliding_window_every=2)
EIGHT_LAYERS = _variant(num_layers=8)  # pp4 x vpp2: one layer per chunk


def _case(name: str, layout: dict[str, Any], *, model: str | dict[str, Any] = "tiny", opt: str = "sgd",
          steps: int = STEPS, **extra: Any) -> dict[str, Any]:
    run = {
        "model": model,
        "training": {"seq_len": 32, "global_batch": 8, "optimizer": opt},
        "gpus": NPROC,
        "layout": layout,
        "lr": 0.5 if opt == "sgd" else 1e-3,
        "seed": 7,
    }
    return {"name": name, "run": run, "steps": steps, **extra}


CASES: list[dict[str, Any]] = [
    # data parallel: FSDP2 per ZeRO stage, DDP, HSDP
    _case("fsdp_dp4_zero3", {"zero_stage": 3}, track_memory=True),
    _case("fsdp_dp4_zero2_mb2", {"zero_stage": 2, "micro_batch": 2}),
    _case("fsdp_dp4_zero1_adamw", {"zero_stage": 1}, opt="adamw", track_memory=True),
    _case("ddp_dp4_zero0", {"zero_stage": 0}),
    _case("hsdp_2x2_zero3", {"dp_shard": 2, "zero_stage": 3}),
    # tied embeddings and a learned position table: one FSDP2 unit of both ends (edge_units)
    _case("fsdp_dp4_zero3_gpt2_like", {"zero_stage": 3}, model=GPT2_LIKE, opt="adamw", track_memory=True),
    # tensor (+ sequence) parallel
    _case("tp2_dp2_sp", {"tp": 2, "zero_stage": 3}),
    _case("tp2_dp2_nosp_adamw", {"tp": 2, "sp": False}, opt="adamw"),
    _case("tp2_dp2_sp_selective", {"tp": 2, "recompute": "selective", "zero_stage": 2}, track_memory=True),
    _case("tp2_dp2_qk_norm", {"tp": 2}, model=QK_NORM),
    _case("tp2_dp2_sp_gpt2_like", {"tp": 2}, model=GPT2_LIKE),
    # pipeline parallel
    _case("pp2_dp2_gpipe", {"pp": 2, "schedule": "gpipe"}, track_memory=True),
    _case("pp2_dp2_1f1b_zero3_full", {"pp": 2, "zero_stage": 3, "recompute": "full", "recompute_layers": 1}, track_memory=True),
    _case("pp2_dp2_interleaved", {"pp": 2, "vpp": 2}),
    _case("pp4_1f1b", {"pp": 4}),
    _case("pp2_dp2_zero_bubble", {"pp": 2, "schedule": "zero_bubble", "framework": "fsdp"}, opt="adamw"),
    _case("pp2_dp2_zero_bubble_v2", {"pp": 2, "vpp": 2, "schedule": "zero_bubble", "framework": "fsdp"}),
    _case("pp2_dp2_zero_bubble_zero2", {"pp": 2, "schedule": "zero_bubble", "framework": "fsdp", "zero_stage": 2}),
    # V-shape schedules (two chunks per rank as a V: rank 0 holds the embedding and the LM head;
    # chunks 1 and 2 of pp2 meet on rank 1 without a send)
    _case("pp2_dp2_zbv", {"pp": 2, "vpp": 2, "schedule": "zbv", "framework": "fsdp"}, track_memory=True),
    # 2 micro-batches, fewer than ZB-V's 2pp - 1 warm-up forwards: torch drops the missing ones
    _case("pp2_dp2_zbv_zero2_mb2", {"pp": 2, "vpp": 2, "schedule": "zbv", "framework": "fsdp", "zero_stage": 2,
                                    "micro_batch": 2}, opt="adamw"),
    _case("pp2_dp2_dualpipev_zero2", {"pp": 2, "vpp": 2, "schedule": "dualpipev", "framework": "fsdp",
                                      "zero_stage": 2}, track_memory=True),
    # looped BFS (torch's ScheduleLoopedBFS): every forward of each local chunk, then every backward
    _case("pp2_dp2_looped_bfs", {"pp": 2, "vpp": 2, "schedule": "looped_bfs", "framework": "fsdp"}, track_memory=True),
    # middle ranks hold neither end; 8 micro-batches = 2pp, DualPipeV's minimum
    _case("pp4_dualpipev", {"pp": 4, "vpp": 2, "schedule": "dualpipev", "framework": "fsdp"}, model=EIGHT_LAYERS),
    _case("tp2_pp2_1f1b", {"tp": 2, "pp": 2, "micro_batch": 2, "recompute": "selective"}),
    _case("pp2_dp2_mla_moe_selective", {"pp": 2, "recompute": "selective"}, model="tiny-mla"),
    # context parallel
    _case("cp2_dp2", {"cp": 2}),
    _case("cp2_dp2_mla_full", {"cp": 2, "recompute": "full"}, model="tiny-mla"),
    _case("cp2_tp2", {"cp": 2, "tp": 2}),
    _case("cp2_pp2_sinks_window", {"cp": 2, "pp": 2}, model=SINKS_WINDOW),
    # expert parallel (carved out of dp x cp)
    _case("ep4_dp4_moe", {"ep": 4}, model="tiny-moe"),
    _case("ep2_dp4_moe_zero2", {"ep": 2, "zero_stage": 2}, model="tiny-moe"),
    _case("ep4_cp2_dp2_mla", {"ep": 4, "cp": 2}, model="tiny-mla"),
    _case("ep2_pp2_moe", {"ep": 2, "pp": 2}, model="tiny-moe"),
    _case("ep2_cp2_moe_selective_zero0", {"ep": 2, "cp": 2, "recompute": "selective", "zero_stage": 0}, model="tiny-moe"),
    # checkpoint: resume under the same layout (uninterrupted run of 4 steps alongside)
    _case("ckpt_pp2_dp2_adamw_full_run", {"pp": 2, "zero_stage": 3}, opt="adamw", steps=4),
    _case("ckpt_pp2_dp2_adamw_resumed", {"pp": 2, "zero_stage": 3}, opt="adamw", steps=4, resume_at=2),
]
BY_NAME = {c["name"]: c for c in CASES}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """Run every case in one 4-process gloo job; returns the output dir and its wall time."""
    tmp = tmp_path_factory.mktemp("parallel")
    cases_file = tmp / "cases.json"
    cases_file.write_text(json.dumps(CASES))
    out = tmp / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
        "-m", "runtime.verify", str(cases_file), str(out),
    ]
    env["PYTHONFAULTHANDLER"] = "1"  # a native crash prints every thread's Python stack
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        # runtime.verify records every Python exception per case and goes on, so torchrun fails only
        # when a process died. One CI run saw a rank abort inside glibc ("malloc(): unaligned tcache
        # chunk detected", gloo + torch 2.13 CPU; not reproduced in 6 local runs): run the job once
        # more, fresh, and fail if it dies again, with both outputs.
        first = f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        warnings.warn(f"the 4-process layout job died; running it once more. First failure:\n{first}", stacklevel=1)
        out = tmp / "out-retry"
        cmd[-1] = str(out)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            pytest.fail(f"{first}\n--- retry ---\ntorchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return out, wall


def _results(out: Path, name: str) -> list[dict[str, Any]]:
    d = out / name
    errors = sorted(d.glob("rank*.error"))
    if errors:
        pytest.fail(f"{name} failed:\n{errors[0].read_text()}")
    files = sorted(d.glob("rank*.pt"))
    assert len(files) == NPROC, f"{name}: {len(files)} rank results"
    return [torch.load(f, weights_only=False) for f in files]


@cache
def _reference(run_json: str, steps: int) -> tuple[list[float], dict[str, Any]]:
    """Single-process run of the same model, seed, data and optimizer (micro-batch kept)."""
    run = json.loads(run_json)
    spec = load_run_spec(run)
    ref = load_run_spec({**run, "gpus": 1, "layout": {"micro_batch": spec.layout.micro_batch}})
    params: dict[str, Any] = {}
    torch.set_num_threads(1)
    res = train(ref, steps=steps, trainer_hook=lambda t: params.update(t.full_parameters()))
    return res.losses, params


def _compare(name: str, out: Path) -> tuple[float, float]:
    case = BY_NAME[name]
    ranks = _results(out, name)
    ref_losses, ref_params = _reference(json.dumps(case["run"], sort_keys=True), case["steps"])
    start = case.get("resume_at", 0)
    max_loss = max_param = 0.0
    seen: set[str] = set()
    for r in ranks:
        got = r["losses"]
        assert len(got) == case["steps"] - start
        for a, b in zip(got, ref_losses[start:], strict=True):
            max_loss = max(max_loss, abs(a - b) / abs(b))
        for k, v in r["params"].items():
            seen.add(k)
            max_param = max(max_param, (v - ref_params[k]).abs().max().item())
    assert seen == set(ref_params), f"parameters missing: {sorted(set(ref_params) - seen)[:5]}"
    atol = SGD_ATOL if case["run"]["training"]["optimizer"] == "sgd" else ADAMW_ATOL
    assert max_loss <= LOSS_RTOL, f"{name}: loss differs by {max_loss:.3g} (relative)"
    assert max_param <= atol, f"{name}: parameters differ by {max_param:.3g}"
    return max_loss, max_param


@pytest.mark.parametrize("name", [c["name"] for c in CASES if not c["name"].startswith("ckpt_")])
def test_layout_matches_single_process(job: tuple[Path, float], name: str) -> None:
    max_loss, max_param = _compare(name, job[0])
    print(f"{name}: max loss rel diff {max_loss:.2e}, max param abs diff {max_param:.2e}")


def test_checkpoint_resume_same_layout(job: tuple[Path, float]) -> None:
    out = job[0]
    full = _results(out, "ckpt_pp2_dp2_adamw_full_run")
    resumed = _results(out, "ckpt_pp2_dp2_adamw_resumed")
    for f, r in zip(full, resumed, strict=True):
        assert r["start_step"] == 2
        assert r["losses"] == f["losses"][2:], "resumed losses differ from the uninterrupted run"
        for k, v in r["params"].items():
            assert torch.equal(v, f["params"][k]), k
    _compare("ckpt_pp2_dp2_adamw_resumed", out)


def test_cpu_memory_tracker_reports_a_peak(job: tuple[Path, float]) -> None:
    ranks = _results(job[0], "fsdp_dp4_zero1_adamw")
    spec = load_run_spec(BY_NAME["fsdp_dp4_zero1_adamw"]["run"])
    n_params = sum(v.numel() for v in ranks[0]["params"].values())
    for r in ranks:
        peak = r["peak_memory_bytes"]
        # at least the parameter + AdamW shards (12 bytes per parameter / 4 ranks) and the
        # unsharded gradients of ZeRO-1 (4 bytes per parameter)
        assert peak is not None and peak > 4 * n_params + 12 * n_params // NPROC
        assert peak < 16 * n_params + 64 * 2**20
    assert spec.layout.zero_stage == 1


GLOO_STAGING_BYTES = 2.3 * 2**20
"""What real gloo runs held above the allocation tracker (docs/verification-notes.md, "Memory":
0-2.3 MiB, gloo's own staging buffers)."""


@pytest.mark.parametrize(
    "name", ["fsdp_dp4_zero1_adamw", "fsdp_dp4_zero3", "fsdp_dp4_zero3_gpt2_like", "pp2_dp2_1f1b_zero3_full", "pp2_dp2_gpipe",
             "tp2_dp2_sp_selective", "pp2_dp2_zbv", "pp2_dp2_dualpipev_zero2", "pp2_dp2_looped_bfs"]
)
def test_fake_world_memory_matches_real_gloo_run(job: tuple[Path, float], name: str) -> None:
    """runtime.fake_world (fake process group + FakeTensorMode) measures what the real 4-rank
    run allocated, per pipeline stage (measured, python -m bench.gloo_memory_gap --runs 5: FSDP
    ZeRO-1 and ZeRO-3, tied or untied, +0.5 KiB in every run, the real run's data tensors; PP
    16.5 KiB; TP + SP 32.5 KiB, 0.7% of this tiny model; ZB-V and DualPipeV, two chunks per rank
    with split weight-gradient passes, 16.5-48.5 KiB, <= 0.9%; 1F1B with ZeRO-3 and full
    recompute 0.5 / 16.5 KiB).

    FSDP's collectives run through `runtime.gloo_comms` on gloo. With gloo's own, the gloo
    worker thread freed the clone its reduce-scatter makes of the whole gradient input, and the
    all-gather output it had filled, whenever it next got the GIL (at 2b7096f): the tied ZeRO-3
    case held +146.8 KiB in 1 job of 5 (over the 128 KiB below: a layer's 646 KiB clone
    outliving the next unit's all-gather), the untied one +234.1 KiB (4.2%) in 2 jobs of 3 and
    +0.5 in the third (the embedding unit's clone), 1F1B ZeRO-3 full recompute stage 0 +329.8
    KiB (5.9%) in 2 of 3 and +16.5 in the third (still so with the reduce-scatter fixed alone:
    a gathered layer freed after the next was allocated).

    Measured, not tested (torch 2.13, bytes real - traced): interleaved 1F1B 82-115 KiB (1.2-1.9%),
    zero bubble 0.5-66 KiB (<= 1.0%), TP2 x PP2 1F1B 33-115 KiB (1.2-3.3%). Two fake-world bugs made the trace of every schedule with two chunks per rank or a
    split backward wrong before (fixed in `parallelize.build_parts` and
    `Trainer._static_stage_args`): deep-copied fake chunks double-counted FSDP's sharded
    parameters (interleaved 1F1B +9.5%), and received activations that did not require grad made
    the input pass free the chunk's graph without computing a gradient and the weight pass do
    nothing (zero bubble stage 1: 3.6 MB traced, 8.9 MB real); together they put DualPipeV at
    +12-14% and ZB-V at -6% / -21%."""
    from runtime.fake_world import measure_stages

    ranks = _results(job[0], name)
    run = load_run_spec(BY_NAME[name]["run"])
    # A sender that runs every forward ahead (GPipe, looped BFS) may leave gloo's staging buffers of
    # sends still in flight in the real run, more when the machine is loaded (772 KiB seen on GPipe's
    # stage 1 under the suite's two workers); never the other way round. Elsewhere no slack: it
    # would hide a trace that misses part of the real peak (ZB-V traced -21% before a fix).
    slack = GLOO_STAGING_BYTES if run.layout.schedule_ in FORWARDS_FIRST_SCHEDULES and run.layout.pp > 1 else 0.0
    for m in measure_stages(run, steps=2):
        real = ranks[m.rank]["peak_memory_bytes"]
        tolerance = max(0.01 * real, 128 * 1024)
        assert -tolerance <= real - m.peak_bytes <= tolerance + slack, (m, real)


def test_job_wall_time(job: tuple[Path, float]) -> None:
    """The bundled job should stay affordable on a 2-core CI runner (about 45-80 s there): warn,
    rather than fail, when it does not, since shared runners vary."""
    if job[1] > 240:
        warnings.warn(f"the 4-process layout job took {job[1]:.0f} s (budget 240 s)", stacklevel=1)
