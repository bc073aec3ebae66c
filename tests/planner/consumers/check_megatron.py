"""Megatron-LM's own parse_args + validate_args on exported megatron_args.sh files (see README.md).

usage: python check_megatron.py MANIFEST.json   (manifest entries: name, path, gpus, vocab_size)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

VENDORED = Path(__file__).resolve().parents[1] / "megatron_lm" / "megatron"
# Source the exported file in a real bash and read back the array and the environment it sets.
READ_BACK = 'source "$1" && printf "%s\\0" "${MEGATRON_ARGS[@]}" && printf "ENV=%s" "${CUDA_DEVICE_MAX_CONNECTIONS-<unset>}"'
USER_ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "10", "--lr", "1e-4"]
"""What the export leaves to the user (data, tokenizer, optimizer schedule), for the parser."""


def _setup() -> object:
    import importlib.util

    import megatron.core.utils as core_utils
    import torch
    from packaging.version import Version

    # Import stubs (README.md): the planned GPU is a Hopper; Transformer Engine 2.9.0.
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    core_utils._te_version = Version("2.9.0")
    # megatron.training from the vendored release, beside the installed megatron.core
    training = VENDORED / "training"
    spec = importlib.util.spec_from_file_location(
        "megatron.training", training / "__init__.py", submodule_search_locations=[str(training)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["megatron.training"] = module
    spec.loader.exec_module(module)
    from megatron.training import arguments

    return arguments


def check(arguments: object, entry: dict) -> dict:
    out = subprocess.run(
        ["bash", "-c", READ_BACK, "bash", entry["path"]], capture_output=True, text=True, check=True,
        env={"PATH": os.environ["PATH"]},
    ).stdout
    body, env = out.rsplit("ENV=", 1)
    argv = [a for a in body.split("\0") if a]
    os.environ["WORLD_SIZE"] = str(entry["gpus"])
    os.environ["RANK"] = "0"
    if env == "<unset>":
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = env
    sys.argv = ["pretrain_gpt.py", *argv, *USER_ARGS, "--vocab-size", str(entry["vocab_size"])]
    args = arguments.parse_args()  # type: ignore[attr-defined]
    arguments.validate_args(args)  # type: ignore[attr-defined]
    args.apply_rope_fusion = False  # stub (README.md): TE's fused RoPE kernel is not installed
    config = arguments.core_transformer_config_from_args(args)  # type: ignore[attr-defined]
    return {
        "argv": argv,
        "cuda_device_max_connections": None if env == "<unset>" else env,
        "tp": args.tensor_model_parallel_size,
        "pp": args.pipeline_model_parallel_size,
        "vpp": args.virtual_pipeline_model_parallel_size or 1,
        "cp": args.context_parallel_size,
        "ep": args.expert_model_parallel_size,
        "etp": args.expert_tensor_parallel_size,
        "dp": args.data_parallel_size,
        "micro_batch": args.micro_batch_size,
        "global_batch": args.global_batch_size,
        "rotary_base": args.rotary_base,
        "use_rope_scaling": args.use_rope_scaling,
        "rope_scaling_factor": args.rope_scaling_factor,
        "config": type(config).__name__,
        "microbatch_group": config.microbatch_group_size_per_vp_stage,
        "router_groups": config.moe_router_num_groups,
        "router_group_topk": config.moe_router_group_topk,
        "fp8_recipe": getattr(args, "fp8_recipe", None) if args.fp8 else None,
    }


def main(manifest: str) -> None:
    arguments = _setup()
    for entry in json.loads(Path(manifest).read_text()):
        try:
            result = {"name": entry["name"], "ok": True, "error": None, "values": check(arguments, entry)}
        except BaseException as exc:  # noqa: BLE001 - report every rejection, SystemExit from argparse too
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
