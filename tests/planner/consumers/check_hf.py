"""The Hugging Face stack's own classes on exported hf_finetune.yaml files (see README.md): each
section goes to the class that reads it in a train.py: `peft.LoraConfig`, `transformers.
BitsAndBytesConfig`, `transformers.HfArgumentParser(TrainingArguments).parse_dict` (with `use_cpu`
added: CI has no GPU, and TrainingArguments refuses bf16 on a machine without one), and the
`accelerate_config` section through Accelerate's `ClusterConfig.from_yaml_file`.

usage: python check_hf.py MANIFEST.json   (manifest entries: name, path)"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path

import yaml

warnings.filterwarnings("ignore")


def check(path: str) -> dict:
    from accelerate.commands.config.config_args import ClusterConfig
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, HfArgumentParser, TrainingArguments

    cfg = yaml.safe_load(Path(path).read_text())
    values: dict = {"model": cfg["model"]}
    if "lora_config" in cfg:
        lora = LoraConfig(**cfg["lora_config"])
        values["lora"] = {"r": lora.r, "alpha": lora.lora_alpha, "targets": sorted(lora.target_modules),
                          "use_dora": lora.use_dora, "modules_to_save": lora.modules_to_save}
    if "bitsandbytes_config" in cfg:
        bnb = BitsAndBytesConfig(**cfg["bitsandbytes_config"])
        values["bnb"] = {"4bit": bnb.load_in_4bit, "8bit": bnb.load_in_8bit, "double": bnb.bnb_4bit_use_double_quant}
    (args,) = HfArgumentParser(TrainingArguments).parse_dict({**cfg["training_arguments"], "use_cpu": True})
    values["args"] = {
        "micro_batch": args.per_device_train_batch_size, "accum": args.gradient_accumulation_steps,
        "checkpointing": bool(args.gradient_checkpointing), "optim": str(args.optim.value),
        "liger": args.use_liger_kernel, "bf16": args.bf16,
        "offload": bool((args.gradient_checkpointing_kwargs or {}).get("offload")),
    }
    with tempfile.TemporaryDirectory() as tmp:
        acc = Path(tmp) / "accelerate_config.yaml"
        acc.write_text(yaml.safe_dump(cfg["accelerate_config"]))
        cluster = ClusterConfig.from_yaml_file(str(acc))
    values["accelerate"] = {"distributed_type": str(cluster.distributed_type), "num_processes": cluster.num_processes}
    return values


def main(manifest: str) -> None:
    for entry in json.loads(Path(manifest).read_text()):
        try:
            out = {"name": entry["name"], "ok": True, "error": None, "values": check(entry["path"])}
        except Exception as exc:  # report every file, the test asserts
            out = {"name": entry["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "values": None}
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
