"""torchtitan 0.3.0's own ConfigManager and ParallelDims on exported config modules (see README.md).

Runs with torchtitan 0.3.0 first on PYTHONPATH (scripts/test.sh installs it with the packages its
config loader imports into .venv/torchtitan-0.3, apart from 0.2.2 in the environment). Each export is
loaded as a user runs it: `--module autopar_torchtitan --config autopar` with the file's directory
on the import path. A TOML file (exports before 0.3 had a module) is given to 0.3.0 as 0.2.x read it,
`--job.config_file`, which 0.3.0 refuses.

Import stubs, each only where a CPU-only machine lacks the hardware or a kernel package: the triton
kernels of `torchtitan.distributed.minimal_async_ep.kernels` (imported by the MoE token dispatcher;
triton has no CPU build) are names that raise if called; the float8 converters' capability check
reports the planned GPU (Hopper, SM 9.0), as the Megatron check's does.

usage: python check_torchtitan_03.py MANIFEST.json   (manifest entries: name, path, gpus, num_layers)"""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

TRITON_KERNELS = (
    "copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel", "topk_scores_grad_kernel",
)


def _stub_triton_kernels() -> None:
    module = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")

    def gpu_only(*args: object, **kwargs: object) -> None:
        raise RuntimeError("triton kernel: needs a GPU")

    for name in TRITON_KERNELS:
        setattr(module, name, gpu_only)
    sys.modules[module.__name__] = module


def main(manifest: str) -> None:
    _stub_triton_kernels()
    import torchtitan
    from torchtitan.components.quantization import float8
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    float8.has_cuda_capability = lambda major, minor: (major, minor) <= (9, 0)  # stub: the planned Hopper GPU
    version = getattr(torchtitan, "__version__", None) or _dist_version()
    for entry in json.loads(Path(manifest).read_text()):
        path = Path(entry["path"])
        try:
            if path.suffix == ".toml":
                args = ["--job.config_file", str(path)]
            else:
                sys.path.insert(0, str(path.parent))
                sys.modules.pop(path.stem, None)
                args = ["--module", path.stem, "--config", "autopar"]
            try:
                cfg = ConfigManager().parse_args(args)
            finally:
                if path.suffix != ".toml":
                    sys.path.remove(str(path.parent))
            par, tr = cfg.parallelism, cfg.training
            dims = ParallelDims.from_config(par, entry["gpus"])  # validates the degrees against the world
            dp = dims.dp_replicate * dims.dp_shard
            assert tr.global_batch_size % (tr.local_batch_size * dp) == 0, "global batch is not local x dp x n"
            if par.pipeline_parallel_degree > 1:
                assert tr.local_batch_size % par.pipeline_parallel_microbatch_size == 0
            model = cfg.model_spec.model
            layers = len(model.layers)
            parts = par.module_fqns_per_model_part or []
            if parts:  # every module of the model, once, in order
                flat = [m for part in parts for m in part]
                assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "lm_head"], flat[-3:]
            text = repr(model.layers[-1])
            values = {
                "release": version,
                "model": cfg.model_spec.name,
                "flavor": cfg.model_spec.flavor,
                "layers": layers,
                "dp_replicate": dims.dp_replicate,
                "dp_shard": dims.dp_shard,
                "tp": dims.tp,
                "pp": dims.pp,
                "cp": dims.cp,
                "ep": dims.ep,
                "grad_accum": tr.global_batch_size // (tr.local_batch_size * dp),
                "global_batch": tr.global_batch_size,
                "model_parts": len(parts),
                "activation_checkpoint": type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint else None,
                "compile": cfg.compile.enable,
                "float8_linear": "Float8" in text and "Linear" in text,
                "float8_experts": "Float8GroupedExperts" in text or "Float8" in text.split("experts", 1)[-1][:400],
            }
            result = {"name": entry["name"], "ok": True, "error": None, "values": values}
        except BaseException as exc:  # noqa: BLE001 - report every rejection, SystemExit from tyro too
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(result), flush=True)


def _dist_version() -> str:
    from importlib.metadata import version

    return version("torchtitan")


if __name__ == "__main__":
    main(sys.argv[1])
