"""torchtitan's own ConfigManager and ParallelDims on exported torchtitan.toml files (see README.md).

usage: python check_torchtitan.py MANIFEST.json   (manifest entries: name, path, gpus)"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
import types
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")


def _import_config_only() -> Path:
    """Import `torchtitan` without its package `__init__` (README.md): that file registers the
    quantization converters, whose kernels import triton. Returns the package directory."""
    spec = importlib.util.find_spec("torchtitan")
    assert spec is not None and spec.submodule_search_locations is not None
    pkg = types.ModuleType("torchtitan")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    sys.modules["torchtitan"] = pkg
    return Path(pkg.__path__[0])


def flavors(root: Path, model: str) -> set[str]:
    """The keys of the config table in torchtitan/models/<model>/__init__.py (read from the
    source: importing a model module pulls in datasets and triton)."""
    tree = ast.parse((root / "models" / model / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            name = getattr(node.targets[0], "id", "")
            if name.endswith("_configs") or name.endswith("_args"):
                return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"no config table in torchtitan/models/{model}/__init__.py")


def converters(root: Path) -> set[str]:
    pattern = re.compile(r"register_model_converter\(\s*\w+\s*,\s*\"([^\"]+)\"")
    return {m for f in (root / "components" / "quantization").glob("*.py") for m in pattern.findall(f.read_text())}


def main(manifest: str) -> None:
    root = _import_config_only()
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    known_converters = converters(root)
    for entry in json.loads(Path(manifest).read_text()):
        try:
            cfg = ConfigManager().parse_args(["--job.config_file", entry["path"]])
            par = cfg.parallelism
            dims = ParallelDims(
                dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree, world_size=entry["gpus"],
            )
            has_model = (root / "models" / cfg.model.name / "__init__.py").is_file()
            table = flavors(root, cfg.model.name) if has_model else set()
            unknown = set(cfg.model.converters) - known_converters
            assert not unknown, f"converters {sorted(unknown)} not registered by torchtitan ({sorted(known_converters)})"
            # torchtitan/distributed/tensor_parallel.py: async TP needs the model compiled
            if par.enable_async_tensor_parallel:
                assert cfg.compile.enable and "model" in cfg.compile.components, "async TP without compile"
            # the trainer's own batch rule (torchtitan/train.py): global = local x dp x accumulation
            dp = dims.dp_replicate * dims.dp_shard
            tr = cfg.training
            assert tr.global_batch_size % (tr.local_batch_size * dp) == 0, "global batch is not local x dp x n"
            if par.pipeline_parallel_degree > 1:
                assert tr.local_batch_size % par.pipeline_parallel_microbatch_size == 0
            values = {
                "model": cfg.model.name,
                "flavor": cfg.model.flavor,
                "known_model": has_model,
                "known_flavor": cfg.model.flavor in table,
                "dp_replicate": dims.dp_replicate,
                "dp_shard": dims.dp_shard,
                "tp": dims.tp,
                "pp": dims.pp,
                "cp": dims.cp,
                "ep": dims.ep,
                "etp": dims.etp,
                "grad_accum": tr.global_batch_size // (tr.local_batch_size * dp),
                "model_parts": len(par.module_fqns_per_model_part or []),
                "description": cfg.job.description,
            }
            result = {"name": entry["name"], "ok": True, "error": None, "values": values}
        except BaseException as exc:  # noqa: BLE001 - report every rejection, SystemExit from tyro too
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
