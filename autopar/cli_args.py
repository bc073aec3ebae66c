"""The CLI's readers of its arguments, shared by every subcommand module (`autopar.cli`,
`autopar.cli_profile`): model and cluster references, the option a field path is spelled as, the
method fields, and the one way a command refuses its input (exit 2 with one line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import typer


def _model_ref(model: str) -> Any:
    """A preset name, or a path to a HuggingFace config.json (or a folder holding one), or to a JSON
    file of ModelSpec fields (what `autopar models --show NAME` prints)."""
    from autopar.cli_support import looks_like_path

    path = Path(model)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise typer.BadParameter(f"cannot read {path} as JSON: {exc}", param_hint="--model") from exc
        if isinstance(data, dict) and "num_layers" in data and "model_type" not in data:
            return data  # ModelSpec fields
        return {"hf_config": data, "name": path.parent.name or path.stem}
    if looks_like_path(model) and not path.exists():
        raise typer.BadParameter(
            f"model file not found: {path} (a model is a preset name, `autopar models`, or a HuggingFace "
            "config.json or a folder holding one)", param_hint="--model",
        )
    return model


def _cluster_ref(cluster: str) -> Any:
    """A preset name, or a path to a cluster YAML file (README, 'Cluster files')."""
    from autopar.cli_support import looks_like_path, read_cluster_file

    if looks_like_path(cluster) or Path(cluster).is_file():
        return read_cluster_file(Path(cluster))
    return cluster


FLAGS = {
    "gpus": "--gpus", "nodes": "--nodes", "precision": "--precision", "memory_headroom": "--headroom",
    "zero_stage": "--zero", "max_zero_stage": "--max-zero", "seq_len": "--seq-len", "global_batch": "--global-batch",
    "global_batch_tokens": "--global-batch-tokens", "grad_dtype": "--grad-dtype", "lora_rank": "--lora-rank",
    "lora_alpha": "--lora-alpha", "lora_targets": "--lora-targets", "quant_format": "--quant-format",
    "micro_batch": "--micro-batch", "recompute_layers": "--recompute-layers", "dp_shard": "--dp-shard",
    "elementwise_kernels": "--elementwise-kernels", "attention_kernel": "--attention-kernel",
}
"""Field names of TrainingSpec / SearchConstraints / Layout as the CLI spells their options (the
rest are `--` + the name with dashes: `tp` -> `--tp`)."""


def _flag(loc: tuple[str, ...] | list[Any]) -> str:
    """The CLI option of a field path (`("training", "precision")` -> `--precision`)."""
    name = str(loc[-1]) if loc else "job"
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def _refuse(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _validation_message(exc: Any) -> str:
    """A pydantic ValidationError as `--option: reason` lines (the CLI's spelling of each field)."""
    parts = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{_flag(err['loc'])}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)


def _method_fields(
    method: str, lora_rank: int | None, lora_alpha: float | None, lora_targets: str | None, quant_format: str | None
) -> dict[str, Any]:
    """The training-method fields of `TrainingSpec` from the CLI options (only those given, so the
    spec's own validation names what does not belong to the method)."""
    out: dict[str, Any] = {"method": method}
    if lora_rank is not None:
        out["lora_rank"] = lora_rank
    if lora_alpha is not None:
        out["lora_alpha"] = lora_alpha
    if lora_targets is not None:
        names = _comma_list(lora_targets) or []
        out["lora_targets"] = names[0] if len(names) == 1 and names[0] in ("all-linear", "attention") else names
    if quant_format is not None:
        out["quant_format"] = quant_format
    return out


def _comma_list(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]
