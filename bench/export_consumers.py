"""Each export format of ten reference plans, checked by the framework's own code (the consumer
checks of tests/planner/consumers/), as a table: plan x format -> ok, or the framework's error.

    python -m bench.export_consumers [--baseline-source DIR] [--real-ranks] [--json] [--out DIR]

The ten plans are what `autopar plan` recommends for the issue's reference jobs (bench/reference_jobs.py)
and for the fine-tuning and DeepSpeed jobs the issue names: LoRA, QLoRA, FP8 DeepSeek-V3, a DeepSpeed
plan that must offload. Checks, with the release each runs:

- megatron: Megatron-LM core_v0.16.1 parse_args + validate_args + core_transformer_config_from_args
- deepspeed: DeepSpeed 0.19.8 DeepSpeedConfig with the mpu the file's initialize lines build (fake
  process group of the plan's world); `--real-ranks`: deepspeed.initialize for real on gloo ranks
  (plans of at most 8 GPUs without CPU offload, whose DeepSpeedCPUAdam would JIT-compile)
- accelerate: Accelerate 1.15.0 launcher + plugins (+ DeepSpeedConfig on what it hands DeepSpeed), and
  the global batch train.py runs from the file's lines, which must be the plan's
- torchtitan: torchtitan 0.2.2 ConfigManager (--job.config_file) + ParallelDims
- torchtitan-0.3: torchtitan 0.3.0 ConfigManager (--module/--config) + ParallelDims; run on the TOML
  (`--job.config_file`) where the exporter has no 0.3 format (the baseline)

`--baseline-source DIR`: also export the same plans with the exporters of another checkout (e.g.
`git archive <commit> | tar -x -C DIR`), the before column; every check is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cluster_specs.presets import get_cluster
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec
from planner.plan import Plan, SearchConstraints
from planner.search import describe, search

REPO = Path(__file__).resolve().parents[1]
CONSUMERS = REPO / "tests" / "planner" / "consumers"

PLANS: list[dict[str, Any]] = [
    # name, model, cluster, gpus, training, constraints: the CLI's defaults unless named
    {"name": "GPT-3 175B / 1024 A100", "model": "gpt3-175b", "cluster": "dgx-a100-80g", "gpus": 1024,
     "training": {"seq_len": 2048, "global_batch": 1536}},
    {"name": "Llama-3-70B / 512 H100", "model": "llama3-70b", "cluster": "dgx-h100", "gpus": 512,
     "training": {"seq_len": 8192, "global_batch": 512}},
    {"name": "Llama-3-405B / 8192 H100", "model": "llama3-405b", "cluster": "dgx-h100", "gpus": 8192,
     "training": {"seq_len": 8192, "global_batch": 2048}},
    {"name": "Mixtral-8x7B / 256 H100", "model": "mixtral-8x7b", "cluster": "dgx-h100", "gpus": 256,
     "training": {"seq_len": 4096, "global_batch": 1024}},
    {"name": "DeepSeek-V3 fp8 / 2048 H800", "model": "deepseek-v3", "cluster": "dgx-h800", "gpus": 2048,
     "training": {"seq_len": 4096, "global_batch": 15360, "precision": "fp8"}},
    {"name": "Llama-3-8B fsdp / 8 H100", "model": "llama3-8b", "cluster": "dgx-h100", "gpus": 8,
     "training": {"seq_len": 8192, "global_batch": 32}, "constraints": {"framework": "fsdp"}},
    {"name": "Llama-3-70B deepspeed / 512 H100", "model": "llama3-70b", "cluster": "dgx-h100", "gpus": 512,
     "training": {"seq_len": 8192, "global_batch": 512}, "constraints": {"framework": "deepspeed"}},
    {"name": "Llama-3-70B LoRA / 16 H100", "model": "llama3-70b", "cluster": "dgx-h100", "gpus": 16,
     "training": {"seq_len": 4096, "global_batch": 32, "method": "lora"}, "constraints": {"framework": "fsdp"}},
    {"name": "LLaMA-65B QLoRA / 1 L40S", "model": "llama-65b", "cluster": "l40s-pcie-8", "gpus": 1,
     "training": {"seq_len": 512, "global_batch": 16, "method": "qlora", "lora_rank": 64, "lora_alpha": 16},
     "constraints": {"framework": "fsdp"}},
    {"name": "Llama-3-70B DeepSpeed offload / 8 A100", "model": "llama3-70b", "cluster": "dgx-a100-80g", "gpus": 8,
     "training": {"seq_len": 4096, "global_batch": 16}, "constraints": {"framework": "deepspeed"}},
]

CHECKS: dict[str, tuple[str, str | None, str]] = {
    # format -> (check script, environment, what it runs)
    "megatron": ("check_megatron.py", None, "Megatron-LM core_v0.16.1 parse_args + validate_args"),
    "deepspeed": ("check_deepspeed.py", None, "DeepSpeed 0.19.8 DeepSpeedConfig, the file's mpu"),
    "accelerate": ("check_accelerate.py", None, "Accelerate 1.15.0 launch + plugins; batch as run"),
    "torchtitan": ("check_torchtitan.py", None, "torchtitan 0.2.2 ConfigManager + ParallelDims"),
    "torchtitan-0.3": ("check_torchtitan_03.py", "torchtitan_03", "torchtitan 0.3.0 ConfigManager + ParallelDims"),
}


def searched_plans() -> dict[str, Plan]:
    """The plan `autopar plan` recommends for each job (default constraints but those named)."""
    out = {}
    for job in PLANS:
        training = TrainingSpec(**job["training"])
        constraints = SearchConstraints(**job.get("constraints", {}))
        out[job["name"]] = search(get_model(job["model"]), training, get_cluster(job["cluster"]), job["gpus"], constraints)
    return out


EXPORT_SCRIPT = """
import json, sys
from pathlib import Path
from planner.exporters import EXPORTERS, export
from planner.plan import Plan
root = Path(sys.argv[1])
out = {}
for path in sorted(root.glob("*/plan.json")):
    plan = Plan.model_validate_json(path.read_text())
    for fmt in EXPORTERS:
        try:
            r = export(plan, fmt)
        except ValueError as exc:
            out.setdefault(path.parent.name, {})[fmt] = {"refused": str(exc)}
            continue
        (path.parent / fmt).mkdir(exist_ok=True)
        (path.parent / fmt / r.filename).write_text(r.text)
        out.setdefault(path.parent.name, {})[fmt] = {"file": str(path.parent / fmt / r.filename)}
print(json.dumps(out))
"""


def write_exports(plans: dict[str, Plan], root: Path, source: Path) -> dict[str, dict[str, dict[str, str]]]:
    """Every format of every plan, written by the exporters of the checkout at `source` (in a subprocess
    with that checkout first on the path); per plan and format, the file or the refusal."""
    for i, (name, plan) in enumerate(plans.items()):
        (root / f"p{i}").mkdir(parents=True, exist_ok=True)
        (root / f"p{i}" / "plan.json").write_text(plan.model_dump_json())
        (root / f"p{i}" / "name.txt").write_text(name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, str(root)], capture_output=True, text=True, env=env,
                          cwd=source, check=True)
    return json.loads(proc.stdout)


def check(plans: dict[str, Plan], root: Path, files: dict[str, dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
    """Per plan name and format: "ok", "refused by the exporter: ..." or the framework's error."""
    sys.path.insert(0, str(CONSUMERS))
    import harness

    keys = {f"p{i}": name for i, name in enumerate(plans)}
    table: dict[str, dict[str, str]] = {name: {} for name in plans}
    for fmt, (script, environment, _) in CHECKS.items():
        manifest = []
        for key, name in keys.items():
            entry = files[key].get(fmt) or (files[key].get("torchtitan") if fmt == "torchtitan-0.3" else None)
            if entry is None or "refused" in entry:
                table[name][fmt] = f"refused by the exporter: {(entry or {}).get('refused', 'no such format')}"
                continue
            if fmt == "accelerate" and "deepspeed" in files[key]:  # its DeepSpeed plugin reads ds_config.json beside it
                ds = Path(files[key]["deepspeed"]["file"])
                (Path(entry["file"]).parent / ds.name).write_text(ds.read_text())
            plan = plans[name]
            assert plan.best is not None  # an export exists
            manifest.append({"name": name, "path": entry["file"], "gpus": plan.inputs.gpus, "tp": plan.best.layout.tp,
                             "pp": plan.best.layout.pp, "vocab_size": plan.inputs.model.vocab_size,
                             "num_layers": plan.inputs.model.num_layers})
        if not manifest:
            continue
        (root / f"check-{fmt}").mkdir(exist_ok=True)
        results = harness.run_check(script, manifest, root / f"check-{fmt}", environment)
        for name, r in results.items():
            table[name][fmt] = "ok" if r["ok"] else r["error"].splitlines()[0][:160]
            if r["ok"] and fmt == "accelerate" and r["values"]["global_batch"] != plans[name].inputs.training.global_batch:
                table[name][fmt] = (f"runs {r['values']['global_batch']} sequences per step, the plan "
                                    f"{plans[name].inputs.training.global_batch}")
    return table


def real_ranks(plans: dict[str, Plan], files: dict[str, dict[str, dict[str, str]]]) -> dict[str, str]:
    """deepspeed.initialize for real (run_deepspeed_ranks.py) on the plans of at most 8 GPUs without CPU offload."""
    out = {}
    for i, (name, plan) in enumerate(plans.items()):
        entry = files[f"p{i}"].get("deepspeed", {})
        lay = plan.best.layout if plan.best else None
        if lay is None or "file" not in entry or plan.inputs.gpus > 8 or lay.offload_optimizer or lay.offload_params:
            continue
        proc = subprocess.run([sys.executable, str(CONSUMERS / "run_deepspeed_ranks.py"), entry["file"], str(plan.inputs.gpus)],
                              capture_output=True, text=True, timeout=1200)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        got: dict[str, Any] = json.loads(lines[-1][len("RESULT "):]) if lines else {"ok": False, "error": proc.stderr[-300:]}
        out[name] = "ok (one optimizer step)" if got["ok"] else str(got["error"]).splitlines()[0][:160]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-source", type=Path, help="a checkout whose exporters give the before column")
    ap.add_argument("--real-ranks", action="store_true", help="also run deepspeed.initialize on gloo ranks (minutes)")
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    ap.add_argument("--out", type=Path, help="keep the exported files here (default: a temporary directory)")
    args = ap.parse_args(argv)
    plans = searched_plans()
    root = args.out or Path(tempfile.mkdtemp(prefix="autopar-exports-"))
    result: dict[str, Any] = {"plans": {n: describe(p.best.layout) if p.best else None for n, p in plans.items()}}
    sources = {"after": REPO, **({"before": args.baseline_source.resolve()} if args.baseline_source else {})}
    for label, source in sources.items():
        files = write_exports(plans, root / label, source)
        result[label] = check(plans, root / label, files)
        if args.real_ranks:
            result[f"{label}_real_ranks"] = real_ranks(plans, files)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for fmt, (_, _, what) in CHECKS.items():
        print(f"\n{fmt}: {what}")
        for name in plans:
            cells = [f"{label}: {result[label][name].get(fmt, '-')}" for label in sources]
            print(f"  {name:40s} " + " | ".join(cells))
    for label in sources:
        if f"{label}_real_ranks" in result:
            print(f"\ndeepspeed.initialize on gloo ranks ({label}):")
            for name, verdict in result[f"{label}_real_ranks"].items():
                print(f"  {name:40s} {verdict}")
    print("\nplans: " + "; ".join(f"{n}: {d}" for n, d in result["plans"].items()))
    print(f"exports in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
