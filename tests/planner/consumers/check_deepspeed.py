"""DeepSpeed's own DeepSpeedConfig on exported ds_config.json files (see README.md), built with the
model-parallel unit the file's `autopar.initialize` lines name, as `deepspeed.initialize` builds it.

The lines run as written under a fake process group of the plan's world size, but for the last one
(`deepspeed.initialize(...)`, which needs the user's model): in its place, DeepSpeedConfig(file, mpu)
with the mpu that call passes (DeepSpeed's `groups` after `_init_tp_mesh_device`, or a
PipelineModule's grid, `model.mpu()`), which is what `deepspeed.initialize` does first and where it
checks the batch. The pipeline's `layer_specs` are the model's layer count of `nn.Identity`.

usage: python check_deepspeed.py MANIFEST.json   (manifest entries: name, path, gpus, num_layers)"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")


PLAIN_INITIALIZE = [
    "import deepspeed",
    "engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=PATH)",
]
"""What a file without `autopar.initialize` lines (exports before they named them) is run with."""


def mpu_of(lines: list[str], namespace: dict[str, Any]) -> Any:
    """Run every line but the initialize call; the mpu that call hands DeepSpeed."""
    *setup, call = lines
    assert call.startswith("engine, optimizer, _, _ = deepspeed.initialize("), call
    exec("\n".join(setup), namespace)  # noqa: S102 - the exported file's own lines, as the user runs them
    if "mpu=groups" in call:
        return namespace["groups"]
    if "PipelineModule" in "\n".join(setup):
        return namespace["model"].mpu()  # deepspeed.initialize: mpu = model.mpu() for a PipelineModule
    assert "mpu=" not in call, call
    return None


def main(manifest: str) -> None:
    import deepspeed.comm as ds_dist
    import deepspeed.comm.torch as ds_torch
    import torch
    import torch.distributed as tdist
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.utils import groups
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ds_torch.build_shm_op = lambda: None  # stub (README.md): no CPU shared-memory kernel JIT build
    os.environ.setdefault("LOCAL_RANK", "0")  # PipelineModule reads it (torchrun sets it)
    for entry in json.loads(Path(manifest).read_text()):
        world = entry["gpus"]
        try:
            config = json.loads(Path(entry["path"]).read_text())
            tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
            ds_dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
            namespace: dict[str, Any] = {
                "layer_specs": [torch.nn.Identity() for _ in range(entry["num_layers"])],
                "model": torch.nn.Linear(2, 2),
            }
            notes = config.get("autopar", {})
            mpu = mpu_of(notes.get("initialize", PLAIN_INITIALIZE), namespace)
            cfg = DeepSpeedConfig(entry["path"], mpu=mpu)
            values = {
                "release": notes.get("release"),
                "mpu": None if mpu is None else "deepspeed.utils.groups" if mpu is groups else type(mpu).__name__,
                "world_size": cfg.world_size,
                "train_batch_size": cfg.train_batch_size,
                "micro_batch": cfg.train_micro_batch_size_per_gpu,
                "grad_accum": cfg.gradient_accumulation_steps,
                "zero_stage": cfg.zero_optimization_stage,
                "bf16": cfg.bfloat16_config.enabled,
                "offload_optimizer": cfg.zero_config.offload_optimizer is not None,
                "offload_optimizer_device": str(getattr(cfg.zero_config.offload_optimizer, "device", "none")),
                "offload_param_device": str(getattr(cfg.zero_config.offload_param, "device", "none")),
                "hpz": cfg.zero_config.zero_hpz_partition_size,
                "qwz": cfg.zero_config.zero_quantized_weights,
                "qgz": cfg.zero_config.zero_quantized_gradients,
                "pipeline_stages": cfg.pipeline.get("stages"),
                "autotp_size": config.get("tensor_parallel", {}).get("autotp_size"),
            }
            result = {"name": entry["name"], "ok": True, "error": None, "values": values}
        except BaseException as exc:  # noqa: BLE001 - report every rejection
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        finally:
            ds_dist.comm.cdb = None
            # DeepSpeed's groups are module globals: reset them for the next file's world
            for name in ("_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP"):
                setattr(groups, name, None)
            groups.mesh_device = None
            if tdist.is_initialized():
                tdist.destroy_process_group()
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
