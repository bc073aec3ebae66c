"""torchtune 0.6.1's own config loading and validation on exported torchtune_config.yaml files (see
README.md), without importing torchtune: its `__init__` imports `torchao.dtypes.nf4tensor`, which
torchao 0.18 (pinned for Accelerate's fp8 launcher) no longer has, so the package is installed
with --no-deps and read as source.

- the file is loaded as torchtune loads a config (`torchtune.config._parse`: `OmegaConf.load`);
- every `_component_` is bound as torchtune's `config.validate` does (`inspect.signature(_component_)
  .bind(**kwargs)`): torchtune's builders and classes from the installed source by `ast` (their
  keyword names, and every parameter without a default given), torch's and torchao's by importing
  them; bitsandbytes (not installed on CPU) by the same component with the same keys in a config
  torchtune ships (`recipes/configs/**.yaml`);
- every top-level key is one the recipe named in the file's header reads (`cfg.X` / `cfg.get("X")`
  in `recipes/<recipe>.py`).

usage: python check_torchtune.py MANIFEST.json   (manifest entries: name, path, recipe)"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

RECIPE_SUPPLIED = {"params", "tokenizer", "model", "ignore_index", "optimizer", "num_training_steps"}
"""Arguments a recipe passes to `config.instantiate` itself (the optimizer's params, the dataset's
tokenizer), not from the config."""


def _site() -> Path:
    spec = importlib.util.find_spec("omegaconf")
    assert spec and spec.origin
    return Path(spec.origin).parent.parent


def _ast_params(dotted: str) -> tuple[set[str] | None, set[str]]:
    """(parameter names, None when it takes **kwargs; required names) of a torchtune function or
    class `__init__`, read from its source: the module path, following `from .x import name`
    re-exports of package `__init__`s and `name = partial(function, ...)` definitions."""
    site = _site()
    module, name = dotted.rsplit(".", 1)
    bound: set[str] = set()
    for _ in range(6):
        base = site / Path(*module.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                names, required = _signature(node.args)
                return names, required - bound
            if isinstance(node, ast.ClassDef) and node.name == name:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        names, required = _signature(item.args)
                        return (None if names is None else names - {"self"}), required - {"self"} - bound
        partial = next((n for n in tree.body if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in n.targets) and isinstance(n.value, ast.Call)
            and n.value.args and isinstance(n.value.args[0], ast.Name)), None)
        if partial is not None:  # name = partial(function, key=value, ...): the function, those keys given
            call = partial.value
            assert isinstance(call, ast.Call) and isinstance(call.args[0], ast.Name)
            name = call.args[0].id
            bound |= {k.arg for k in call.keywords if k.arg}
            continue
        for node in tree.body:  # a re-export: follow it
            if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
                target = node.module or ""
                if node.level == 0:
                    module = target
                else:
                    pkg = (module if base.is_dir() else module.rsplit(".", 1)[0]).split(".")
                    module = ".".join(pkg[: len(pkg) - node.level + 1]) + ("." + target if target else "")
                break
        else:
            raise LookupError(f"{dotted} not found in torchtune's source")
    raise LookupError(f"{dotted}: re-exports too deep")


def _signature(args: ast.arguments) -> tuple[set[str] | None, set[str]]:
    positional = args.posonlyargs + args.args
    names: set[str] | None = {a.arg for a in positional + args.kwonlyargs}
    if args.kwarg is not None:
        names = None  # takes any keyword
    required = {a.arg for a in positional[: len(positional) - len(args.defaults)]}
    required |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}
    return names, required


def _shipped_components() -> dict[str, list[set[str]]]:
    """`_component_` -> the key sets it is given in the configs torchtune ships."""
    from omegaconf import OmegaConf

    out: dict[str, list[set[str]]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "_component_" in node:
                out.setdefault(node["_component_"], []).append(set(node) - {"_component_"})
            for v in node.values():
                walk(v)

    for path in (_site() / "recipes" / "configs").rglob("*.yaml"):
        try:
            walk(OmegaConf.to_container(OmegaConf.load(path)))
        except Exception:  # a few shipped configs interpolate run-time values
            continue
    return out


def _bind(component: str, keys: set[str], shipped: dict[str, list[set[str]]]) -> str | None:
    """None when `component` takes `keys`, else why not."""
    if component.startswith("torchtune."):
        found, required = _ast_params(component)
        names = keys | (found or set()) if found is None else found
    elif component.startswith(("torch.", "torchao.")):
        module, name = component.rsplit(".", 1)
        sig = inspect.signature(getattr(importlib.import_module(module), name))
        names = set(sig.parameters)
        required = {n for n, p in sig.parameters.items() if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            names |= keys
    else:
        if not any(keys <= ks for ks in shipped.get(component, [])):
            return f"{component} with {sorted(keys)} appears in no config torchtune ships"
        return None
    unknown = keys - names
    missing = required - keys - RECIPE_SUPPLIED
    if unknown or missing:
        return f"{component}: unknown {sorted(unknown)}, missing {sorted(missing)}"
    return None


def _recipe_keys(recipe: str) -> set[str]:
    text = (_site() / "recipes" / f"{recipe}.py").read_text()
    return set(re.findall(r"cfg\.get\(\s*\"([a-z_]+)\"", text)) | set(re.findall(r"cfg\.([a-z_]+)\b", text)) - {"get"}


def check(path: str, recipe: str, shipped: dict[str, list[set[str]]]) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(cfg, dict)
    problems = []
    for _key, value in cfg.items():
        if isinstance(value, dict) and "_component_" in value:
            why = _bind(value["_component_"], set(value) - {"_component_"}, shipped)
            if why:
                problems.append(why)
    unread = set(cfg) - _recipe_keys(recipe) - {"output_dir", "metric_logger", "profiler"}
    if unread:
        problems.append(f"keys {sorted(unread)} are not read by recipes/{recipe}.py")
    if problems:
        raise ValueError("; ".join(problems))
    return {
        "recipe": recipe, "model": cfg["model"]["_component_"], "batch_size": cfg["batch_size"],
        "accum": cfg["gradient_accumulation_steps"], "checkpointing": cfg["enable_activation_checkpointing"],
        "offloading": cfg["enable_activation_offloading"], "optimizer": cfg["optimizer"]["_component_"],
        "loss": cfg["loss"]["_component_"], "quantize_base": cfg["model"].get("quantize_base"),
        "lora_rank": cfg["model"].get("lora_rank"),
    }


def main(manifest: str) -> None:
    shipped = _shipped_components()
    for entry in json.loads(Path(manifest).read_text()):
        try:
            out = {"name": entry["name"], "ok": True, "error": None, "values": check(entry["path"], entry["recipe"], shipped)}
        except Exception as exc:  # report every file, the test asserts
            out = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
