"""The checks of a job's inputs that `autopar plan` / `autopar evaluate` and the API share: what the
field-by-field validation of `TrainingSpec`, `SearchConstraints` and `ClusterSpec` cannot see,
because it needs two inputs at once (the precision and the GPU, the pinned degrees and the GPU
count). Each problem names its field (`loc`, as the API's error paths: ``("training",
"precision")``) and why; the CLI prints them as ``--flag: reason``, the API answers 422 with them.

- **GPU count**: an integer of at least 1 (a JSON boolean is not a count).
- **Precision against the GPU**: a precision whose dense peak the GPU's datasheet does not list is
  refused (`GPUSpec.peak_flops_per_s`): fp8 on an A100 or a V100 (no FP8 tensor cores: the GEMMs
  would run in 16-bit while the memory model counts 1-byte activations), bf16 on a V100. The
  message names what the GPU has.
- **Pinned degrees** (`SearchConstraints.tp/pp/cp/ep/dp`): each must divide the GPU count and
  their product too, context parallelism is not a DeepSpeed dimension, expert parallelism needs an
  MoE model whose expert count it divides. Otherwise the search would enumerate nothing and have
  no rejection to show; this says which pin leaves nothing to search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster_specs.spec import ClusterSpec
from model_specs.spec import ModelSpec, TrainingSpec
from planner.plan import SearchConstraints

PRECISION_WORDS = {"fp8": "FP8", "bf16": "BF16", "fp16": "FP16", "fp32": "FP32"}


@dataclass(frozen=True)
class InputProblem:
    """One refused input: its field path (API style) and the reason, a sentence."""

    loc: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{'.'.join(self.loc)}: {self.message}"


class InputError(ValueError):
    """Inputs the planner refuses; `problems` lists each with its field."""

    def __init__(self, problems: Sequence[InputProblem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def gpu_count_problems(gpus: Any, loc: tuple[str, ...] = ("gpus",)) -> list[InputProblem]:
    """A GPU count is an integer >= 1 (a boolean is not a count)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        return [InputProblem(loc, f"{gpus!r} is not a whole number of GPUs")]
    if gpus < 1:
        return [InputProblem(loc, f"{gpus} GPUs: a job needs at least 1 GPU")]
    return []


def precision_problems(training: TrainingSpec, cluster: ClusterSpec) -> list[InputProblem]:
    """The precision's dense peak must be on the GPU's datasheet (`GPUSpec.peak_flops_per_s`)."""
    gpu = cluster.gpu
    have = sorted(gpu.peak_flops_per_s)
    if training.precision in gpu.peak_flops_per_s:
        return []
    word = PRECISION_WORDS.get(training.precision, training.precision)
    units = "tensor cores" if gpu.vendor != "cpu" else "kernels"
    return [InputProblem(
        ("training", "precision"),
        f"{training.precision} on {gpu.name}: its datasheet lists no {word} {units} (it has "
        f"{', '.join(have)}), so the GEMMs would run in another precision than the memory is counted in; "
        f"plan with one of {', '.join(have)}, or on a GPU that has {word}",
    )]


def pinned_degree_problems(model: ModelSpec, gpus: int, c: SearchConstraints) -> list[InputProblem]:
    """Pinned degrees that leave the search nothing to enumerate, each named with the reason."""
    out: list[InputProblem] = []
    pins = {name: getattr(c, name) for name in ("tp", "pp", "cp", "dp") if getattr(c, name) is not None}
    for name, value in pins.items():
        if gpus % value:
            out.append(InputProblem(
                ("constraints", name),
                f"{name}={value} does not divide {gpus} GPUs: every layout's degrees multiply to the GPU count "
                f"(divisors of {gpus}: {_divisor_text(gpus)})",
            ))
    if out:
        return out
    product = math.prod(v for k, v in pins.items())
    if pins and gpus % product:
        named = " x ".join(f"{k}={v}" for k, v in pins.items())
        out.append(InputProblem(
            ("constraints", next(iter(pins))),
            f"{named} = {product} does not divide {gpus} GPUs: no layout has these degrees together",
        ))
    fixed = c.tp or 1, c.pp or 1, c.cp or 1
    if c.dp is not None and c.tp is not None and c.pp is not None and c.cp is not None and math.prod(fixed) * c.dp != gpus:
        out.append(InputProblem(
            ("constraints", "dp"),
            f"dp={c.dp} with tp={c.tp} pp={c.pp} cp={c.cp} makes {math.prod(fixed) * c.dp} GPUs, not {gpus}",
        ))
    if c.cp is not None and c.cp > 1 and c.framework == "deepspeed":
        out.append(InputProblem(
            ("constraints", "cp"),
            f"cp={c.cp} with framework deepspeed: DeepSpeed has no context-parallel dimension (Ulysses sequence "
            "parallelism is model code); pin cp=1 or plan with --framework megatron or fsdp",
        ))
    if c.ep is not None and c.ep > 1:
        if not model.is_moe:
            out.append(InputProblem(
                ("constraints", "ep"), f"ep={c.ep} on {model.name}: expert parallelism needs an MoE model (this one is dense)"
            ))
        elif model.num_experts % c.ep:
            out.append(InputProblem(
                ("constraints", "ep"), f"ep={c.ep} does not divide the {model.num_experts} experts of {model.name}"
            ))
        elif gpus % c.ep:
            out.append(InputProblem(("constraints", "ep"), f"ep={c.ep} does not divide {gpus} GPUs"))
    return out


def plan_problems(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: Any, constraints: SearchConstraints | None = None
) -> list[InputProblem]:
    """Everything refused about a search's inputs (`planner.search.search`), empty when it may run."""
    out = gpu_count_problems(gpus)
    if out:
        return out
    out += precision_problems(training, cluster)
    out += pinned_degree_problems(model, gpus, constraints or SearchConstraints())
    return out


def evaluation_problems(training: TrainingSpec, cluster: ClusterSpec, gpus: Any) -> list[InputProblem]:
    """Everything refused about an evaluation's inputs (`cost_models.jobs.Job`) that its layout's
    own validation does not say: the GPU count and the precision on the GPU."""
    out = gpu_count_problems(gpus)
    if out:
        return out
    return precision_problems(training, cluster)


def check_plan(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, gpus: Any, constraints: SearchConstraints | None = None
) -> None:
    """Raise `InputError` with every problem of `plan_problems`."""
    problems = plan_problems(model, training, cluster, gpus, constraints)
    if problems:
        raise InputError(problems)


def check_evaluation(training: TrainingSpec, cluster: ClusterSpec, gpus: Any) -> None:
    """Raise `InputError` with every problem of `evaluation_problems`."""
    problems = evaluation_problems(training, cluster, gpus)
    if problems:
        raise InputError(problems)


def _divisor_text(n: int, limit: int = 12) -> str:
    from planner.space import divisors

    divs = divisors(n)
    return ", ".join(map(str, divs[:limit])) + (", ..." if len(divs) > limit else "")


def run_checked_job(raw: dict[str, Any], partitioner: Any = None) -> dict[str, Any]:
    """`cost_models.jobs.run_job` for one evaluation job, with `evaluation_problems` checked first:
    `{"ok": false, "error": "<field>: <reason>"}` for a refused input, never an exception."""
    from pydantic import ValidationError

    from cost_models.jobs import Job, resolve_cluster, run_job

    try:
        job = Job.model_validate(raw)
        cluster = resolve_cluster(job.cluster)
    except (ValidationError, ValueError, KeyError, TypeError):
        return run_job(raw, partitioner)  # its own message for what does not validate or resolve
    problems = evaluation_problems(job.training, cluster, job.gpus)
    if problems:
        return {"ok": False, "error": "; ".join(str(p) for p in problems)}
    return run_job(raw, partitioner)
