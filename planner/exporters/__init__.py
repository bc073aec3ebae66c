"""Exporters: a Plan's chosen layout as launch files for other training stacks.

`export(plan, fmt)` returns an `ExportResult(text, filename, lost)`; `lost` lists, one sentence
each, what the target cannot express and what the file does instead. Formats (`EXPORTERS`):

- `torchrun`: multi-node launch of our runtime (`python -m runtime.launch plan.json`)
- `megatron`: Megatron-LM / Megatron-Core `pretrain_gpt.py` arguments (bash array)
- `deepspeed`: DeepSpeed `ds_config.json`
- `torchtitan`: torchtitan 0.2.x job config (TOML, `--job.config_file`)
- `torchtitan-0.3`: torchtitan 0.3 config module (Python, `--module autopar_torchtitan --config autopar`)
- `accelerate`: Hugging Face Accelerate config, FSDP2 or DeepSpeed plugin (YAML)
- `hf`: the Hugging Face fine-tuning stack (YAML: TrainingArguments, PEFT LoraConfig, BitsAndBytesConfig,
  from_pretrained keywords and the Accelerate config) of a plan priced in stack hf
- `torchtune`: a torchtune recipe config (YAML) of a plan priced in stack torchtune

Each file names the framework release it is written for and checked against, and how to launch it;
tests/planner/consumers/ feeds each to that release's own parser and validation.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.exporters.accelerate import export_accelerate
from planner.exporters.common import ExportError, ExportResult, Job, job_of
from planner.exporters.deepspeed import export_deepspeed
from planner.exporters.hf import export_hf
from planner.exporters.megatron import export_megatron
from planner.exporters.torchrun import export_torchrun
from planner.exporters.torchtitan import export_torchtitan
from planner.exporters.torchtitan_module import export_torchtitan_module
from planner.exporters.torchtune import export_torchtune
from planner.plan import Candidate, Plan

__all__ = ["EXPORTERS", "STACK_FORMATS", "ExportError", "ExportResult", "export", "formats"]

EXPORTERS: dict[str, Callable[[Job], ExportResult]] = {
    "torchrun": export_torchrun,
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "torchtitan": export_torchtitan,
    "torchtitan-0.3": export_torchtitan_module,
    "accelerate": export_accelerate,
    "hf": export_hf,
    "torchtune": export_torchtune,
}


STACK_FORMATS = ("hf", "torchtune")
"""The fine-tuning stacks' exports: a plan priced in that stack (`Layout.stack`); the others export
every plan (`formats`)."""


def formats() -> list[str]:
    """The formats every plan exports to (the service lists these); `STACK_FORMATS` beside them."""
    return [f for f in EXPORTERS if f not in STACK_FORMATS]


def export(plan: Plan, fmt: str, candidate: Candidate | None = None) -> ExportResult:
    """Export the plan's best candidate (or `candidate`, e.g. one of its alternatives) as `fmt`.
    Raises `ExportError` for an unknown format or a plan with no feasible layout."""
    key = fmt.strip().lower()
    if key not in EXPORTERS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of: {', '.join(EXPORTERS)}")
    return EXPORTERS[key](job_of(plan, candidate))
