"""Accelerate's own config classes and launcher validation on exported accelerate_config.yaml
files (see README.md).

usage: python check_accelerate.py MANIFEST.json   (manifest entries: name, path, gpus)"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")


def main(manifest: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    base = dict(os.environ)
    for entry in json.loads(Path(manifest).read_text()):
        try:
            cluster = ClusterConfig.from_yaml_file(entry["path"])
            # what every node runs: accelerate launch --config_file F --machine_rank R --main_process_ip A
            argv = ["--config_file", entry["path"], "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "train.py"]
            args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
            env = prepare_multi_gpu_env(args)
            os.environ.clear()
            os.environ.update(base)
            os.environ.update(env)
            par = ParallelismConfig()
            fsdp = FullyShardedDataParallelPlugin()
            values = {
                "num_processes": args.num_processes,
                "num_machines": args.num_machines,
                "main_process_ip": cluster.main_process_ip,
                "parallel_total": par.total_size,
                "dp_replicate": par.dp_replicate_size,
                "dp_shard": par.dp_shard_size,
                "tp": par.tp_size,
                "cp": par.cp_size,
                "fsdp_version": fsdp.fsdp_version,
                "reshard_after_forward": fsdp.reshard_after_forward,
                "mixed_precision": env["ACCELERATE_MIXED_PRECISION"],
            }
            result = {"name": entry["name"], "ok": True, "error": None, "values": values}
        except BaseException as exc:  # noqa: BLE001 - report every rejection
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
