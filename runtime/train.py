"""Training loop of a RunSpec: synthetic data, AdamW/SGD, grad accumulation, pipeline schedules,
distributed checkpoints and a Profile.

Data: step `i` draws the global batch (global_batch sequences of seq_len + 1 tokens) from a
generator seeded by (seed, i), identically on every rank and for every layout: windows of a
tokenized file (`RunSpec.data_path`, a flat array of token ids) when given, else synthetic. DP rank d takes
sequences [d*B/dp, (d+1)*B/dp); micro-batch j of it the next `micro_batch` of those; CP rank r the
token positions of its load-balanced chunks. Sequences follow x[t+1] = (x[t] + stride) mod V with
a per-sequence random start and stride and 10% random tokens, so the loss visibly falls.

Loss: mean next-token cross-entropy over the global batch. Each micro-batch's mean loss is divided
by the number of micro-batches; data-parallel reduction (FSDP/replicate over dp x cp) averages
the rest. The logged loss of a step is the same global mean, whatever the layout, so runs of one
RunSpec under different layouts can be compared number by number.

Checkpoints (`torch.distributed.checkpoint`): model and optimizer state dicts keyed by the
layout-independent parameter names (flattened optimizer state), plus the next step index. A job
started with the checkpoint directory of an earlier one resumes at that step.

Profile (written by rank 0): step times after warm-up, peak memory per rank (CUDA allocator, or
the live-storage tracker on CPU), tokens/s, MFU against a given peak, losses, environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.host import peak_rss_bytes, return_freed_memory, seconds_since_start
from runtime.memory import LiveStorageTracker, peak_memory_bytes, reset_peak_memory
from runtime.mesh import Meshes, build_meshes
from runtime.parallelize import ModelParts, build_parts, compute_dtype, tp_reduce_partial_grads
from runtime.spec import RunSpec, traced_layout

__all__ = ["Trainer", "TrainResult", "global_batch", "init_distributed", "train"]


# ---- data -------------------------------------------------------------------------------------------


def global_batch(run: RunSpec, step: int) -> torch.Tensor:
    """The global batch of `step`: (global_batch, seq_len + 1) int64 tokens, layout-independent.
    From `run.data_path` when given (`token_file_batch`), else synthetic."""
    if run.data_path is not None:
        return token_file_batch(run, step)
    b, s, v = run.training.global_batch, run.training.seq_len, run.model.vocab_size
    g = torch.Generator().manual_seed(run.seed * 1_000_003 + step)
    start = torch.randint(0, v, (b, 1), generator=g)
    stride = torch.randint(1, 8, (b, 1), generator=g)
    seq = (start + stride * torch.arange(s + 1)[None, :]) % v
    noise = torch.rand(b, s + 1, generator=g) < 0.1
    return torch.where(noise, torch.randint(0, v, (b, s + 1), generator=g), seq)


def token_file_batch(run: RunSpec, step: int) -> torch.Tensor:
    """(global_batch, seq_len + 1) int64 windows of the token file `run.data_path` (a flat array of
    `run.data_dtype` token ids, memory-mapped), at offsets drawn from a generator seeded by (seed,
    step): every rank and every layout reads the same windows. Token ids must be below the vocab."""
    import numpy as np

    b, s = run.training.global_batch, run.training.seq_len
    assert run.data_path is not None
    tokens = np.memmap(run.data_path, dtype=np.dtype(run.data_dtype), mode="r")
    if tokens.shape[0] < s + 1:
        raise ValueError(f"{run.data_path} holds {tokens.shape[0]} tokens; a sequence needs {s + 1}")
    g = torch.Generator().manual_seed(run.seed * 1_000_003 + step)
    starts = torch.randint(0, tokens.shape[0] - s, (b,), generator=g).tolist()
    rows = np.stack([np.asarray(tokens[i : i + s + 1], dtype=np.int64) for i in starts])
    out = torch.from_numpy(rows)
    if int(out.max()) >= run.model.vocab_size:
        raise ValueError(f"{run.data_path}: token id {int(out.max())} >= vocab size {run.model.vocab_size}")
    return out


def local_batch(run: RunSpec, meshes: Meshes, step: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets) of this rank: (grad_accum x micro_batch, local sequence)."""
    lay = run.layout
    full = global_batch(run, step)
    per_dp = run.training.global_batch // lay.dp_
    rows = full[meshes.dp_rank * per_dp : (meshes.dp_rank + 1) * per_dp]
    tokens, targets = rows[:, :-1], rows[:, 1:]
    return tokens[:, positions].contiguous(), targets[:, positions].contiguous()


def _local(t: torch.Tensor) -> torch.Tensor:
    """The value of a (replicated) DTensor loss as a plain tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# ---- distributed setup ------------------------------------------------------------------------------


def init_distributed(run: RunSpec) -> torch.device:
    """Initialise the process group from torchrun's environment when the job has several ranks.
    Returns this rank's device (cuda:LOCAL_RANK with nccl, else cpu)."""
    backend = run.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        return_freed_memory()  # a CPU rank's tensors are host memory: give freed pages back (runtime.host)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != run.world_size:
        raise ValueError(f"the layout needs {run.world_size} ranks; launched with {world}")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return device


# ---- trainer ------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    start_step: int = 0
    startup_s: float | None = None  # this process's start to the first step (runtime.host)
    startup_phases_s: dict[str, float] = field(default_factory=dict)  # build, materialize, init, load
    host_peak_rss_bytes: int | None = None  # this process's peak resident memory at the end
    staged_bytes: int = 0  # the largest local tensor read from a checkpoint, in its dtype (0: seeded)


class Trainer:
    """The parallel model, optimizers and (with pp > 1) pipeline schedule of one RunSpec."""

    def __init__(
        self,
        run: RunSpec,
        device: torch.device,
        meshes: Meshes | None = None,
        fake_mode: contextlib.AbstractContextManager | None = None,
        timings: dict[str, float] | None = None,
    ):
        """`fake_mode`: a FakeTensorMode to materialise the model in (memory tracing with a fake
        process group, `runtime.fake_world`); pipeline stages then get static shapes. `timings`
        receives the seconds of each build phase (`runtime.parallelize.build_parts`)."""
        self.run = run
        self.device = device
        self.fake = fake_mode is not None
        self.meshes = meshes or build_meshes(run.layout, device.type)
        self.parts: ModelParts = build_parts(run, self.meshes, device, fake_mode, timings=timings)
        # what start-up stages in host memory: the largest local tensor read from a checkpoint
        self.staged_bytes = self.parts.staged_bytes
        self.dtype = compute_dtype(run, device)
        opt_cls = torch.optim.AdamW if run.training.optimizer == "adamw" else torch.optim.SGD
        kw: dict[str, Any] = {"lr": run.lr, "weight_decay": run.weight_decay}
        if opt_cls is torch.optim.AdamW:
            kw["foreach"] = True
        # Frozen parameters (a LoRA base, DeepSeek's expert bias) get no gradient and no state.
        self.optimizers = [opt_cls([p for p in m.parameters() if p.requires_grad], **kw) for m in self.parts.chunks]
        from runtime.context_parallel import cp_positions

        self.positions = cp_positions(run.training.seq_len, run.layout.cp, self.meshes.cp_rank)
        self.schedule = self._build_schedule() if run.layout.pp > 1 else None
        self.step_index = 0

    # ---- pipeline ------------------------------------------------------------------------------
    def _build_schedule(self):  # type: ignore[no-untyped-def]
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleDualPipeV,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleInterleavedZeroBubble,
            ScheduleLoopedBFS,
            ScheduleZBVZeroBubble,
        )

        lay = self.run.layout
        group = self.meshes["pp"].get_group()
        stages = [
            PipelineStage(
                m,
                stage_index=c,
                num_stages=self.parts.num_chunks,
                device=self.device,
                group=group,
                **(self._static_stage_args(c) if self.fake else {}),
            )
            for m, c in zip(self.parts.chunks, self.parts.chunk_ids, strict=True)
        ]
        # Schedules over a list of the rank's stages (zbv, dualpipev: two chunks as a V, placed by
        # `build_parts` as torch's `generate_stage_to_rank_mapping(style="v")` maps them; DualPipeV
        # needs >= 2pp micro-batches, `validate_layout` checks it) or over its one stage.
        multi = {
            "interleaved_1f1b": ScheduleInterleaved1F1B, "zero_bubble": ScheduleInterleavedZeroBubble,
            "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV, "looped_bfs": ScheduleLoopedBFS,
        }
        single = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
        if lay.schedule_ in multi:
            schedule = multi[lay.schedule_](stages, n_microbatches=lay.grad_accum_, loss_fn=_loss_fn)
        else:
            schedule = single[lay.schedule_](stages[0], n_microbatches=lay.grad_accum_, loss_fn=_loss_fn)
        if self.fake:
            # The warm-up vote on static vs dynamic shapes reads a tensor's value, which fake
            # tensors do not have: every stage here has static shapes.
            from torch.distributed.pipelining._utils import InferenceMode

            def static_warmup(stages: list, has_backward: bool, p2p_done: bool) -> None:
                for st in stages:
                    st._inference_mode = InferenceMode.STATIC

            schedule._warmup_p2p = static_warmup  # type: ignore[method-assign]
        return schedule

    def _static_stage_args(self, chunk: int) -> dict[str, Any]:
        """Example input/output of pipeline chunk `chunk` on the meta device (a fake process group
        cannot exchange the shapes at run time). Works for any placement: the first chunk takes
        the tokens and the last returns the logits whichever rank holds them (rank 0 holds both in
        a V). Floating-point activations carry `requires_grad=True`, as torch's dynamic shape
        inference records them when training (`PipelineStage._create_act_recv_info`): a received
        activation then requires grad, so the stage computes (and sends) its input gradient, and
        the split-backward schedules (zero_bubble, zbv, dualpipev) keep the graph from the input
        pass to the weight pass. Without it the input pass of a non-first chunk computed no
        gradient and freed the chunk's graph, the weight pass found nothing to do, and the trace
        missed the weight gradients and what is held between the two passes."""
        run, lay = self.run, self.run.layout
        mb, s = lay.micro_batch, run.training.seq_len // lay.cp
        s_hidden = s // lay.tp if lay.tp > 1 and lay.sp_ else s
        h, v = run.model.hidden_size, run.model.vocab_size
        act = self.dtype
        meta = torch.device("meta")

        def hidden(grad: bool = True) -> torch.Tensor:
            return torch.empty(mb, s_hidden, h, dtype=act, device=meta, requires_grad=grad)

        first, last = chunk == 0, chunk == self.parts.num_chunks - 1
        out: dict[str, Any] = {
            "input_args": torch.empty(mb, s, dtype=torch.long, device=meta) if first else hidden(),
            "output_args": torch.empty(mb, s, v, dtype=act, device=meta, requires_grad=True) if last else hidden(),
        }
        if not last:
            out["output_grads"] = hidden(grad=False)
        if not first:
            out["input_grads"] = hidden(grad=False)
        return out

    def _loss_parallel(self) -> contextlib.AbstractContextManager:
        """Vocabulary-parallel cross-entropy when the logits are TP-sharded (forward and backward)."""
        if self.run.layout.tp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype == torch.float32 or self.parts.fsdp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    # ---- one optimizer step --------------------------------------------------------------------
    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> float:
        """Run step `self.step_index` on its data (or on `batch`: this rank's tokens and targets);
        returns the global mean loss (NaN when tracing with fake tensors)."""
        run, lay = self.run, self.run.layout
        tokens, targets = batch or local_batch(run, self.meshes, self.step_index, self.positions)
        tokens, targets = tokens.to(self.device), targets.to(self.device)
        ga, mb = lay.grad_accum_, lay.micro_batch
        local_loss = torch.zeros((), device=self.device)
        if self.schedule is None:
            model = self.parts.chunks[0]
            for i in range(ga):
                if self.parts.fsdp:
                    # ZeRO-0/1: reduce once per step; ZeRO-2/3: every micro-batch (sharded grads).
                    sync = i == ga - 1 or lay.zero_stage >= 2
                    model.set_requires_gradient_sync(sync)  # type: ignore[operator]
                with self._loss_parallel():
                    with self._autocast():
                        logits = model(tokens[i * mb : (i + 1) * mb])
                    loss = _loss_fn(logits, targets[i * mb : (i + 1) * mb])
                    (loss / ga).backward()
                local_loss += _local(loss.detach())
            local_loss /= ga
        else:
            losses: list[torch.Tensor] = []
            args = (tokens,) if self.parts.has_first else ()
            # return_outputs=False: the last stage would otherwise keep every micro-batch's
            # logits until the end of the step, to merge them for the caller.
            kwargs: dict[str, Any] = {"return_outputs": False}
            if self.parts.has_last:
                kwargs.update(target=targets, losses=losses)
            with self._loss_parallel(), self._autocast():
                self.schedule.step(*args, **kwargs)
            if losses:
                local_loss = torch.stack([_local(x.detach()).float() for x in losses]).mean()
        if self.parts.tp_partial_modules:
            tp_reduce_partial_grads(self.parts.tp_partial_modules, self.meshes["tp"])
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.step_index += 1
        return self._global_loss(local_loss)

    def _global_loss(self, local: torch.Tensor) -> float:
        if self.fake:
            return float("nan")
        if self.meshes.world is None:
            return float(local)
        local = local.detach().float().clone()
        if self.run.layout.pp > 1:  # the last stage holds the loss
            if not self.parts.has_last:
                local.zero_()
            dist.all_reduce(local, group=self.meshes["pp"].get_group())
        if self.run.layout.dp_ * self.run.layout.cp > 1:
            dist.all_reduce(local, group=self.meshes["dp_cp"].get_group())
            local /= self.run.layout.dp_ * self.run.layout.cp
        return float(local)

    # ---- state ---------------------------------------------------------------------------------
    def _state_dicts(self) -> tuple[list[dict], list[dict]]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(flatten_optimizer_state_dict=True)
        models = [get_model_state_dict(m, options=opts) for m in self.parts.chunks]
        optims = [
            get_optimizer_state_dict(m, o, options=opts)
            for m, o in zip(self.parts.chunks, self.optimizers, strict=True)
        ]
        return models, optims

    def save(self, path: str | Path) -> None:
        """Save model, optimizer and the next step index with torch.distributed.checkpoint."""
        import torch.distributed.checkpoint as dcp

        models, optims = self._state_dicts()
        state = {
            "model": {k: v for d in models for k, v in d.items()},
            "optim": {k: v for d in optims for k, v in d.items()},
            "train": {"step": torch.tensor(self.step_index)},
        }
        dcp.save(state, checkpoint_id=str(path))

    def load(self, path: str | Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        models, optims = self._state_dicts()
        state = {
            "model": {k: v for d in models for k, v in d.items()},
            "optim": {k: v for d in optims for k, v in d.items()},
            "train": {"step": torch.tensor(0)},
        }
        dcp.load(state, checkpoint_id=str(path))
        opts = StateDictOptions(flatten_optimizer_state_dict=True)
        for m, o, msd, osd in zip(self.parts.chunks, self.optimizers, models, optims, strict=True):
            set_model_state_dict(m, {k: state["model"][k] for k in msd}, options=opts)
            set_optimizer_state_dict(m, o, {k: state["optim"][k] for k in osd}, options=opts)
        self.step_index = int(state["train"]["step"])

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Unsharded parameters this rank's chunks hold, by layout-independent name (a collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        out: dict[str, torch.Tensor] = {}
        for m in self.parts.chunks:
            sd = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))
            out.update({k: v.detach().cpu().clone() for k, v in sd.items()})
        return out


def _has_checkpoint(path: Path) -> bool:
    return (path / ".metadata").exists()


def train(
    run: RunSpec,
    *,
    steps: int | None = None,
    checkpoint_dir: str | Path | None = None,
    track_memory: bool = False,
    device: torch.device | None = None,
    trainer_hook: Any = None,
    on_step: Any = None,
) -> TrainResult:
    """Train `run` for `steps` (default run.steps) from the checkpoint in `checkpoint_dir` if one is
    there (then saving it back at the end). Needs the process group when the world is > 1.
    `on_step(step, steps, loss, step_s)` is called after every step (progress reporting)."""
    device = device or init_distributed(run)
    steps = run.steps if steps is None else steps
    tracker = LiveStorageTracker() if track_memory and device.type == "cpu" else None
    with tracker or contextlib.nullcontext():
        res = TrainResult()
        trainer = Trainer(run, device, timings=res.startup_phases_s)
        ckpt = Path(checkpoint_dir) if checkpoint_dir else None
        if ckpt is not None and _has_checkpoint(ckpt):
            t0 = time.perf_counter()
            trainer.load(ckpt)
            res.startup_phases_s["resume_s"] = time.perf_counter() - t0
        res.start_step = trainer.step_index
        res.staged_bytes = trainer.staged_bytes
        res.startup_s = seconds_since_start()
        reset_peak_memory(device, tracker)
        while trainer.step_index < steps:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            loss = trainer.train_step()  # the loss all-reduce synchronises the ranks
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            res.step_times_s.append(time.perf_counter() - t0)
            res.losses.append(loss)
            if on_step is not None:
                on_step(trainer.step_index, steps, loss, res.step_times_s[-1])
        res.peak_memory_bytes = peak_memory_bytes(device, tracker)
        res.host_peak_rss_bytes = peak_rss_bytes()
        if ckpt is not None:
            trainer.save(ckpt)
        if trainer_hook is not None:
            trainer_hook(trainer)
    return res


# ---- profile -----------------------------------------------------------------------------------------


def environment(device: torch.device, backend: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device.type,
        "backend": backend,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        env["cuda"] = torch.version.cuda
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def make_profile(run: RunSpec, res: TrainResult, device: torch.device, peak_flops_per_s: float | None) -> dict[str, Any]:
    """Profile JSON of a finished run (call on every rank: gathers the per-rank peaks)."""
    from cost_models.finetune import FineTune, adapter_params_per_token
    from cost_models.flops import step_flops

    mine = (res.peak_memory_bytes, res.startup_s, res.host_peak_rss_bytes, res.startup_phases_s, res.staged_bytes)
    ranks: list[Any] = [mine]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    peaks = [r[0] for r in ranks]
    timed = res.step_times_s[run.warmup_steps :] or res.step_times_s
    step_s = sum(timed) / len(timed) if timed else None
    tokens = run.training.global_batch * run.training.seq_len
    tr = run.training
    # LoRA: no weight-gradient GEMMs on the frozen base, plus the adapters (cost_models.flops)
    flops = step_flops(
        run.model, tr.seq_len, tr.global_batch, frozen_base=tr.frozen_base,
        adapter_params_per_token=adapter_params_per_token(run.model, FineTune.of(tr)),
    ).model_flops
    tps = tokens / step_s if step_s else None
    peak = peak_flops_per_s or run.peak_flops_per_s
    mfu = flops / (step_s * run.world_size * peak) if (step_s and peak) else None
    backend = dist.get_backend() if dist.is_initialized() else "none"
    return {
        "plan_id": run.plan_id,
        "layout": run.layout.model_dump(),
        "partition": list(run.partition or ()),
        "start_step": res.start_step,
        "warmup_steps": run.warmup_steps,
        "step_times_s": res.step_times_s,
        "step_s": step_s,
        "peak_memory_bytes_per_rank": peaks,
        "memory_source": "cuda.max_memory_allocated" if device.type == "cuda" else "live-storage tracker (CPU)",
        "startup_s_per_rank": [r[1] for r in ranks],
        "startup_phases_s": _phases_per_rank([r[3] for r in ranks]),
        "host_peak_rss_bytes_per_rank": [r[2] for r in ranks],
        "host_memory_predicted_bytes": predicted_host_peak_bytes(run, device, max(r[4] for r in ranks)),
        "tokens_per_step": tokens,
        "tokens_per_s": tps,
        "model_flops_per_step": flops,
        "peak_flops_per_s": peak,
        "mfu": mfu,
        "mfu_convention": "model FLOPs (6NT + full-attention scores, 4NT + adapters with a frozen base, "
        "cost_models.flops.step_flops) / (step_s x GPUs x peak)",
        "losses": res.losses,
        "environment": environment(device, backend),
    }


def _phases_per_rank(phases: list[dict[str, float]]) -> dict[str, list[float | None]]:
    """{phase: [seconds of each rank]} from each rank's {phase: seconds}."""
    keys = sorted({k for p in phases for k in p})
    return {k: [p.get(k) for p in phases] for k in keys}


def predicted_host_peak_bytes(run: RunSpec, device: torch.device, staged_bytes: int) -> int | None:
    """The cost model's host memory of this run's worst rank (`cost_models.memory.
    meta_build_host_bytes_per_rank`, the process itself left out): on a CPU device the rank's whole
    allocated peak lives in host memory (the estimate of its worst stage without the allocator
    reserve, priced as the runtime executes it: `runtime.spec.traced_layout` on the
    local-cpu preset); on a GPU what start-up stages there, `staged_bytes` (the largest local
    tensor as read from a checkpoint; a seeded start stages one tile at a time, negligible)."""
    from cost_models.memory import meta_build_host_bytes_per_rank

    allocated = 0.0
    if device.type == "cpu":
        from cluster_specs.presets import get_cluster
        from cost_models.estimate import estimate

        try:
            est = estimate(run.model, run.training, get_cluster("local-cpu"), run.gpus, traced_layout(run), run.stage_partition)
        except ValueError:  # a layout the runtime runs but the cost model refuses to price: no prediction
            return None
        allocated = max(b.total - b.reserve for b in est.memory)
    return int(meta_build_host_bytes_per_rank(allocated, staged_bytes, device_is_host=device.type == "cpu"))


def write_profile(profile: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(profile, indent=2))
