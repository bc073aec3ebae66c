"""Planning a fine-tuning job in its stack: the stack by default, and its memory techniques searched.

`finetune_constraints` says which stack a job runs in: the one the user names, else for a frozen base
(lora, qlora) Hugging Face's (transformers' Trainer / accelerate + PEFT on FSDP), the stack that runs
every method we price; a full fine-tune without a stack keeps the framework the user named. A stack
also sets the kernels a user gets without saying more (no torch.compile: eager norms and elementwise
ops; `cost_models.stacks`), unless the constraints name them.

`search_finetune` then searches the techniques a fine-tuner turns (`TECHNIQUES`): activation
checkpointing, activation offloading (under checkpointing), 8-bit AdamW (paged or not), optimizer-in-backward
(torchtune's full fine-tuning, one micro-batch per step), the chunked / fused loss (torchtune's
chunked cross-entropy, Liger's fused linear cross-entropy under HF), each combination a search of its
own (`planner.search.search`: a stack runs data parallelism only, so each is small), and keeps the
fastest plan that fits. Combinations whose plans are within `TIE` of the fastest are a tie, broken
towards fewer techniques (each one is a moving part, and 8-bit AdamW changes the numerics). What a
stack cannot run is never tried (`cost_models.layout.stack_violations` says why), and the plan's
explanation names the stack, the techniques chosen and what the others cost.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from cluster_specs.spec import ClusterSpec
from cost_models import stacks
from model_specs.spec import ModelSpec, TrainingSpec
from planner.plan import Plan, SearchConstraints

TIE = 0.03
"""Plans within 3% of the fastest step time are a tie, broken towards fewer techniques (the planner's
own resolution is a quarter of the error band, 2-4%)."""

STACK_NAMES = {
    "hf": "Hugging Face Trainer / accelerate + PEFT",
    "torchtune": "torchtune recipes",
}


def finetune_constraints(training: TrainingSpec, constraints: SearchConstraints, gpus: int = 0) -> SearchConstraints:
    """The constraints with the job's stack resolved (module doc); unchanged when none applies. On one
    GPU a stack runs without a sharding wrapper: ZeRO-0."""
    given = constraints.model_fields_set
    stack = constraints.stack
    if stack is None and training.frozen_base and "framework" not in given:
        stack = "hf"
    if stack is None:
        return constraints
    update: dict[str, Any] = {"stack": stack}
    if "framework" not in given or constraints.framework not in stacks.defaults(stack).frameworks:
        update["framework"] = stacks.defaults(stack).frameworks[0]
    if "elementwise_kernels" not in given:
        update["elementwise_kernels"] = "eager"  # no torch.compile unless asked (both stacks' defaults)
    if "norm_kernel" not in given:
        update["norm_kernel"] = "eager_fp32"
    for dim in ("tp", "pp", "cp", "ep"):
        if getattr(constraints, dim) is None:
            update[dim] = 1  # a stack trains data-parallel only
    if gpus == 1 and constraints.zero_stage is None:
        update["zero_stage"] = 0
    return constraints.model_copy(update=update)


def technique_grid(training: TrainingSpec, c: SearchConstraints, gpus: int) -> list[dict[str, Any]]:
    """Every combination of the stack's techniques the constraints leave open (module doc), the
    stack's defaults first. A technique the user pinned is not searched."""
    given = c.model_fields_set
    st = c.stack
    assert st is not None
    options: dict[str, list[Any]] = {}
    if "recompute" not in given:
        options["recompute"] = ["none", "full"]
    if "cross_entropy" not in given:
        options["cross_entropy"] = [None, "chunked" if st == "torchtune" else "fused_linear"]
    if "optimizer_state" not in given and c.allow_8bit_optimizer and training.optimizer == "adamw":
        # 8-bit AdamW, and bitsandbytes' paged 8-bit one (the QLoRA recipe's, torchtune's 8B_full_single_device's)
        options["optimizer_state"] = ["full", "int8", "int8_paged"]
    if "offload_activations" not in given:
        options["offload_activations"] = [False, True]
    if "optimizer_in_backward" not in given and st == "torchtune" and not training.frozen_base:
        options["optimizer_in_backward"] = [False, True]
    out = []
    for values in itertools.product(*options.values()):
        combo = dict(zip(options, values, strict=True))
        recompute = combo.get("recompute", c.recompute)
        if combo.get("offload_activations") and recompute != "full":
            continue  # both stacks offload under activation checkpointing only
        out.append(combo)
    return out


def weights_of(training: TrainingSpec, stack: str | None) -> str | None:
    """How a full fine-tune's trained weights are kept in the stack (`cost_models.stacks`), for the
    explanation: float32 under 16-bit autocast (the model loaded in float32: its exporter writes that
    dtype beside bf16 / fp16), or in the compute dtype without a float32 master. None under a frozen
    base (the adapters' dtype is the stack's own)."""
    if training.frozen_base:
        return None
    if stacks.autocast_weights(training, stack):
        return f"float32 weights, gradients and AdamW states under {training.precision} autocast (model loaded in float32)"
    if stacks.master_weights(training, stack) or training.precision == "fp32":
        return "float32 weights"
    return f"{training.precision} weights and optimizer states, no float32 master (model loaded in {training.precision})"


def techniques_of(layout: Any, default_loss: str) -> list[str]:
    """Names of the techniques a layout runs (for the CLI and the explanation)."""
    out = []
    if layout.recompute == "full":
        out.append("activation checkpointing")
    if layout.offload_activations:
        out.append("activation offloading")
    if layout.optimizer_state != "full":
        out.append({"int8": "8-bit AdamW", "int8_paged": "paged 8-bit AdamW", "paged": "paged AdamW",
                    "int4": "4-bit AdamW"}[layout.optimizer_state])
    if layout.optimizer_in_backward:
        out.append("optimizer in backward")
    if layout.cross_entropy_ != default_loss:
        out.append({"chunked": "chunked cross-entropy", "fused_linear": "fused linear cross-entropy (Liger)",
                    "eager": "eager cross-entropy"}.get(layout.cross_entropy_, layout.cross_entropy_))
    return out


def search_finetune(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterSpec,
    gpus: int,
    constraints: SearchConstraints | None = None,
    *,
    search: Callable[..., Plan] | None = None,
    **kwargs: Any,
) -> Plan:
    """Plan a job in its fine-tuning stack, searching the stack's techniques (module doc). A job
    without a stack is `planner.search.search` unchanged."""
    from planner.search import search as plain_search

    run = search or plain_search
    c = finetune_constraints(training, constraints or SearchConstraints(), gpus)
    if c.stack is None:
        return run(model, training, cluster, gpus, c, **kwargs)
    grid = technique_grid(training, c, gpus) if c.search_techniques else [{}]
    plans: list[tuple[dict[str, Any], Plan]] = []
    for combo in grid:
        plans.append((combo, run(model, training, cluster, gpus, c.model_copy(update=combo), **kwargs)))
    feasible = [(combo, p) for combo, p in plans if p.best is not None]
    default_loss = stacks.defaults(c.stack).cross_entropy
    if not feasible:
        combo, plan = plans[-1] if len(plans) > 1 else plans[0]
        plan.why.insert(0, f"stack {c.stack} ({STACK_NAMES[c.stack]}) on {c.framework}: no combination of its "
                        f"{len(plans)} technique settings fits (the last tried: every technique on)")
        return plan
    fastest = min(p.best.step_s for _, p in feasible)  # type: ignore[union-attr]
    ties = [(combo, p) for combo, p in feasible if p.best.step_s <= fastest * (1 + TIE)]  # type: ignore[union-attr]
    combo, plan = min(ties, key=lambda cp: (len(techniques_of(cp[1].best.layout, default_loss)), cp[1].best.step_s))  # type: ignore[union-attr]
    assert plan.best is not None
    chosen = techniques_of(plan.best.layout, default_loss)
    weights = weights_of(training, c.stack)
    lines = [
        f"stack {c.stack} ({STACK_NAMES[c.stack]}) on {plan.best.layout.framework}; "
        f"{weights + '; ' if weights else ''}techniques: "
        f"{', '.join(chosen) or 'none beyond the stack defaults'} (searched {len(plans)} combinations, "
        f"{len(feasible)} fit)"
    ]
    if plans[0][1].best is None and chosen:  # the grid starts with every technique off
        lines.append(f"without {', '.join(chosen)} no layout fits")
    plan.why[:0] = lines
    return plan
