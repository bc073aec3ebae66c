"""Accelerate's own config classes and launcher validation on exported accelerate_config.yaml
files (see README.md): FSDP2 files through ParallelismConfig and the FSDP plugin, DeepSpeed files
through the DeepSpeed launcher's environment and DeepSpeedPlugin (which loads the ds_config.json the
file names, from the file's own directory, as `accelerate launch` run there would), then DeepSpeed's
DeepSpeedConfig on the config Accelerate hands `deepspeed.initialize` (its "auto" values filled as
`Accelerator._prepare_deepspeed` fills them, no model-parallel unit: Accelerate passes none) under a
fake process group of the launch's process count.

The batch: the file's launch lines give train.py's DataLoader batch size and the accumulation
(`ACCELERATE_GRADIENT_ACCUMULATION_STEPS=K` on the launch line, or the DeepSpeed config's); a file
without them (exports before they said so) is read as its summary line tells a user to run it (the
plan's micro-batch and accumulation). `global_batch` = that x the data-parallel ranks Accelerate
forms (replicate x shard; for DeepSpeed, every process).

usage: python check_accelerate.py MANIFEST.json   (manifest entries: name, path, gpus)"""

from __future__ import annotations

import copy
import json
import os
import re
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


def _batch_lines(text: str) -> tuple[int | None, int | None]:
    """(DataLoader batch size, accumulation) the file's comments give train.py."""
    micro = re.search(r"DataLoader batch_size: (\d+)", text)
    accum = re.search(r"ACCELERATE_GRADIENT_ACCUMULATION_STEPS=(\d+)", text)
    if micro is None:  # an older file: its summary line's plan knobs
        knobs = re.search(r"micro-batch (\d+) x (\d+) accumulation", text)
        if knobs:
            return int(knobs.group(1)), int(knobs.group(2))
    return (int(micro.group(1)) if micro else None), (int(accum.group(1)) if accum else None)


def _deepspeed_config_as_prepared(plugin: Any, micro: int, processes: int) -> dict[str, Any]:
    """The config `Accelerator._prepare_deepspeed` hands deepspeed.initialize (accelerate 1.15.0):
    "auto" values filled from the DataLoader's batch size and the process count."""
    gas = plugin.get_value("gradient_accumulation_steps")
    plugin.deepspeed_config_process(
        must_match=False,
        gradient_clipping=1.0,
        train_micro_batch_size_per_gpu=micro,
        train_batch_size=micro * gas * processes,
        **{"zero_optimization.stage3_gather_16bit_weights_on_model_save": False},
    )
    return copy.deepcopy(plugin.deepspeed_config)


def _deepspeed_check(config: dict[str, Any], processes: int) -> dict[str, Any]:
    """DeepSpeedConfig(config) with no mpu, under a fake process group of `processes` ranks."""
    import deepspeed.comm as ds_dist
    import deepspeed.comm.torch as ds_torch
    import torch.distributed as tdist
    from deepspeed.runtime.config import DeepSpeedConfig
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ds_torch.build_shm_op = lambda: None  # stub (README.md): no CPU shared-memory kernel JIT build
    try:
        tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=processes)
        ds_dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        cfg = DeepSpeedConfig({k: v for k, v in config.items() if k != "autopar"})
        return {"ds_world_size": cfg.world_size, "ds_train_batch_size": cfg.train_batch_size}
    finally:
        ds_dist.comm.cdb = None
        if tdist.is_initialized():
            tdist.destroy_process_group()


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
            micro, accum = _batch_lines(path.read_text())
            if args.use_deepspeed:
                from accelerate.utils import DeepSpeedPlugin

                assert micro is not None, "the file gives train.py no DataLoader batch size"
                plugin = DeepSpeedPlugin()
                plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
                prepared = _deepspeed_config_as_prepared(plugin, micro, args.num_processes)
                values |= _deepspeed_check(prepared, args.num_processes)
                accum = plugin.get_value("gradient_accumulation_steps")
                ranks = args.num_processes  # no model-parallel unit: DeepSpeed's data-parallel size is the world
            else:
                ranks = values["dp_replicate"] * values["dp_shard"]
            values |= {
                "num_processes": args.num_processes,
                "num_machines": args.num_machines,
                "main_process_ip": cluster.main_process_ip,
                "micro_batch": micro,
                "gradient_accumulation": accum,
                "data_parallel_ranks": ranks,
                "global_batch": None if micro is None or accum is None else micro * accum * ranks,
            }
            result = {"name": entry["name"], "ok": True, "error": None, "values": values}
        except BaseException as exc:  # noqa: BLE001 - report every rejection
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
