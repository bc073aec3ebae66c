"""deepspeed.initialize for real, on gloo ranks of this machine: the exported ds_config.json and its
`autopar.initialize` lines as written (the mpu the file names included), with a tiny Llama of
transformers standing in for the user's model, then one optimizer step (every accumulation micro-step).

Each rank runs in its own process (torch.multiprocessing spawn), in the file's directory (the lines
name `config='ds_config.json'`). The process group is gloo, set up before the lines run (on a CPU
DeepSpeed would otherwise pick oneCCL); `deepspeed.init_distributed()` then finds it initialized.

usage: python run_deepspeed_ranks.py DS_CONFIG.json WORLD   (prints one RESULT line, rank 0's)"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

PLAIN_INITIALIZE = [
    "import deepspeed",
    "engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), "
    "config='ds_config.json')",
]
"""What a file without `autopar.initialize` lines is run with: the plain call its DeepSpeed docs show."""


def rank_main(rank: int, world: int, config_path: str, port: int, out: str) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    os.chdir(Path(config_path).parent)
    import deepspeed.comm.torch as ds_torch
    import torch
    import torch.distributed as tdist
    from transformers import LlamaConfig, LlamaForCausalLM

    ds_torch.build_shm_op = lambda: None  # stub (README.md): no CPU shared-memory kernel JIT build
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # the same weights and batches on every rank (TP ranks must see the same inputs)
    model = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
        vocab_size=128, max_position_embeddings=64,
    ))
    config = json.loads(Path(config_path).read_text())
    namespace: dict[str, Any] = {"model": model}
    result: dict[str, Any]
    try:
        lines = config.get("autopar", {}).get("initialize") or PLAIN_INITIALIZE  # files before they named them
        exec("\n".join(lines), namespace)  # noqa: S102 - the file's lines as written
        engine = namespace["engine"]
        micro = config["train_micro_batch_size_per_gpu"]
        for _ in range(engine.gradient_accumulation_steps()):
            ids = torch.randint(0, 128, (micro, 16))
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        result = {
            "ok": True, "error": None,
            "values": {
                "train_batch_size": engine.train_batch_size(),
                "micro_batch": engine.train_micro_batch_size_per_gpu(),
                "grad_accum": engine.gradient_accumulation_steps(),
                "dp_world_size": engine.dp_world_size,
                "global_steps": engine.global_steps,
                "autotp_size": engine.autotp_size(),
                "loss": float(loss),
            },
        }
    except BaseException as exc:  # noqa: BLE001 - report the rejection
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000], "values": None}
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    tdist.destroy_process_group()


def main(config_path: str, world: int) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(Path(config_path).with_suffix(".result.json"))
    mp.spawn(rank_main, args=(world, str(Path(config_path).resolve()), port, out), nprocs=world, join=True)
    print("RESULT " + Path(out).read_text(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
