"""DeepSpeed's own DeepSpeedConfig on exported ds_config.json files (see README.md).

usage: python check_deepspeed.py MANIFEST.json   (manifest entries: name, path, gpus, tp, pp)"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")


class DataParallelOnly:
    """The `mpu` DeepSpeed asks for its data-parallel size: world / (TP x PP), as DeepSpeed's
    pipeline topology (PipeModelDataParallelTopology) and AutoTP groups leave it."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size

    def get_data_parallel_rank(self) -> int:
        return 0


def main(manifest: str) -> None:
    import deepspeed.comm as ds_dist
    import deepspeed.comm.torch as ds_torch
    import torch.distributed as tdist
    from deepspeed.runtime.config import DeepSpeedConfig
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ds_torch.build_shm_op = lambda: None  # stub (README.md): no CPU shared-memory kernel JIT build
    for entry in json.loads(Path(manifest).read_text()):
        world = entry["gpus"]
        try:
            tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
            ds_dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
            dp = world // (entry["tp"] * entry["pp"])
            cfg = DeepSpeedConfig(entry["path"], mpu=DataParallelOnly(dp))
            values = {
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
            }
            result = {"name": entry["name"], "ok": True, "error": None, "values": values}
        except BaseException as exc:  # noqa: BLE001 - report every rejection
            result = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        finally:
            ds_dist.comm.cdb = None
            if tdist.is_initialized():
                tdist.destroy_process_group()
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
