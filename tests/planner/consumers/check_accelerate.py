"""Accelerate's own config classes and launcher validation on exported accelerate_config.yaml
files (see README.md): FSDP2 files through ParallelismConfig and the FSDP plugin, DeepSpeed files
through the DeepSpeed launcher's environment and DeepSpeedPlugin (which loads the ds_config.json the
file names, from the file's own directory, as `accelerate launch` run there would).

usage: python check_accelerate.py MANIFEST.json   (manifest entries: name, path, gpus)"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")


def _fsdp_values(env: dict[str, str]) -> dict[str, Any]:
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

    par = ParallelismConfig()
    fsdp = FullyShardedDataParallelPlugin()
    return {
        "plugin": "fsdp",
        "parallel_total": par.total_size,
        "dp_replicate": par.dp_replicate_size,
        "dp_shard": par.dp_shard_size,
        "tp": par.tp_size,
        "cp": par.cp_size,
        "fsdp_version": fsdp.fsdp_version,
        "reshard_after_forward": fsdp.reshard_after_forward,
        "mixed_precision": env["ACCELERATE_MIXED_PRECISION"],
    }


def _deepspeed_values(env: dict[str, str]) -> dict[str, Any]:
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin()  # reads the launcher's environment; raises on keys that clash with a config file
    plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])  # as AcceleratorState does
    config = plugin.deepspeed_config
    precision = "fp16" if config["fp16"]["enabled"] else "bf16" if config["bf16"]["enabled"] else "no"
    return {
        "plugin": "deepspeed",
        "config_file": env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"),
        "zero_stage": plugin.zero_stage,
        "offload_optimizer_device": plugin.offload_optimizer_device,
        "offload_param_device": plugin.offload_param_device,
        "zero3_init_flag": plugin.zero3_init_flag,
        "gradient_accumulation_steps": plugin.gradient_accumulation_steps,
        "zero_optimization": config["zero_optimization"],
        "tensor_parallel": config.get("tensor_parallel"),
        "mixed_precision": precision,
    }


def main(manifest: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    base = dict(os.environ)
    for entry in json.loads(Path(manifest).read_text()):
        try:
            path = Path(entry["path"]).resolve()
            os.chdir(path.parent)  # where every node launches: a DeepSpeed config file is found there
            cluster = ClusterConfig.from_yaml_file(str(path))
            # what every node runs: accelerate launch --config_file F --machine_rank R --main_process_ip A
            argv = ["--config_file", str(path), "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "train.py"]
            args, defaults, mp_from_config = _validate_launch_command(launch_command_parser().parse_args(argv))
            if args.use_deepspeed:  # as accelerate.commands.launch.launch_command passes them on
                fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
                args.deepspeed_fields_from_accelerate_config = ",".join(fields)
                _, env = prepare_deepspeed_cmd_env(args)
            else:
                env = prepare_multi_gpu_env(args)
            os.environ.clear()
            os.environ.update(base)
            os.environ.update(env)
            values = _deepspeed_values(env) if args.use_deepspeed else _fsdp_values(env)
            values |= {
                "num_processes": args.num_processes,
                "num_machines": args.num_machines,
                "main_process_ip": cluster.main_process_ip,
            }
            result = {"name": entry["name"], "ok": True, "error": None, "values": values}
        except BaseException as exc:  # noqa: BLE001 - report every rejection
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
