"""The new user's walk (README's first command, then the inputs a new user gets wrong): every input
ends in a one-line error naming its option and why, never a traceback; the plan output says what each
figure is (the rank order and its reason, the band, what host memory holds); help is readable at 100
columns."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
PLAN_8B = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--seq-len", "4096", "--global-batch", "16"]


def _refused(args: list[str], *needles: str) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    for needle in needles:
        assert needle in r.output, r.output
    return r.output


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--gpus", "-8"], ["--gpus: -8 GPUs: a job needs at least 1 GPU"]),
        (["--gpus", "0"], ["--gpus: 0 GPUs: a job needs at least 1 GPU"]),
        (["--nodes", "0"], ["--nodes: 0 nodes: a job needs at least 1 node"]),
        (["--gpus", "8", "--nodes", "1"], ["give --gpus or --nodes, not both"]),
        ([], ["give the job's size: --gpus N"]),
        (["--gpus", "8", "--tp", "3"], ["--tp: tp=3 does not divide 8 GPUs", "divisors of 8: 1, 2, 4, 8"]),
        (["--gpus", "8", "--tp", "4", "--cp", "4"], ["tp=4 x cp=4 = 16 does not divide 8 GPUs"]),
        (["--gpus", "8", "--ep", "2"], ["--ep: ep=2 on llama3-8b: expert parallelism needs an MoE model"]),
        (["--gpus", "8", "--cp", "2", "--framework", "deepspeed"], ["DeepSpeed has no context-parallel dimension"]),
        (["--gpus", "8", "--headroom", "1.5"], ["--headroom: Input should be less than 1"]),
        (["--gpus", "8", "--export", "slurm"], ["--export: unknown format 'slurm'; choose one of: torchrun"]),
        # tp, cp and pp pinned: every layout folds to 8 data-parallel ranks in Accelerate, which 12 does not split over
        (["--gpus", "8", "--global-batch", "12", "--tp", "1", "--cp", "1", "--pp", "2", "--export", "accelerate"],
         ["--export accelerate:", "does not split over 8 data-parallel ranks"]),
    ],
)
def test_plan_refuses_bad_sizes_and_pins_by_option(extra: list[str], needles: list[str]) -> None:
    _refused([*PLAN_8B, *extra], *needles)


def test_fp8_on_a100_is_refused_by_plan_evaluate_and_jobs(tmp_path: Path) -> None:
    """A100 has no FP8 tensor cores: planning fp8 there would price bf16 GEMMs with fp8 memory."""
    a100 = ["--model", "llama3-8b", "--cluster", "dgx-a100-80g", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16", "--precision", "fp8"]
    _refused(["plan", *a100], "--precision: fp8 on A100-80GB", "it has bf16, fp16, fp32")
    r = runner.invoke(app, ["evaluate", *a100, "--json"])
    assert r.exit_code == 2 and "training.precision: fp8 on A100-80GB" in json.loads(r.stdout)["error"]
    jobs = tmp_path / "jobs.jsonl"
    line = {"model": "llama3-8b", "cluster": "dgx-a100-80g", "gpus": 8,
            "training": {"seq_len": 4096, "global_batch": 16, "precision": "fp8"}}
    jobs.write_text(json.dumps(line) + "\n" + json.dumps({**line, "cluster": "dgx-h100"}) + "\n")
    out = [json.loads(x) for x in runner.invoke(app, ["evaluate", "--jobs", str(jobs), "--workers", "1"]).stdout.splitlines()]
    assert out[0]["ok"] is False and "no FP8 tensor cores" in out[0]["error"]
    assert out[1]["ok"] is True


def test_cluster_file_values_need_units_and_gpu_takes_vendor_units(tmp_path: Path) -> None:
    no_unit = tmp_path / "c.yaml"
    no_unit.write_text("gpu: H100-80GB\ngpus_per_node: 8\nhost_memory: 512\n")
    _refused(["plan", "--model", "llama3-8b", "--cluster", str(no_unit), "--gpus", "8", "--global-batch", "16"],
             "host_memory: 512 has no unit", "GiB", "host_memory_bytes as a plain number")
    vendor = tmp_path / "v.yaml"
    vendor.write_text(
        "gpu: {name: my-h100, memory: 80 GiB, memory_bandwidth: 3.35 TB/s, gpu_link: 900 GB/s bidirectional,\n"
        "      peak_dense: {bf16: 989.4 TFLOPS, fp8: 1978.9 TFLOPS}}\n"
        "gpus_per_node: 8\nintra_node: {kind: nvswitch, bus_bandwidth: 368 GB/s, latency: 1.9 us}\nhost_memory: 2 TiB\n"
    )
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", str(vendor), "--gpus", "8", "--global-batch", "16",
                            "--json"])
    assert r.exit_code == 0, r.output
    gpu = json.loads(r.stdout)["inputs"]["cluster"]["gpu"]
    assert gpu["memory_bytes"] == 80 * 2**30 and gpu["link_bandwidth_bytes_per_s"] == 450e9
    bare = tmp_path / "b.yaml"
    bare.write_text(vendor.read_text().replace("memory: 80 GiB", "memory: 80"))
    _refused(["plan", "--model", "llama3-8b", "--cluster", str(bare), "--gpus", "8", "--global-batch", "16"],
             "gpu.memory: 80 has no unit")


def test_plan_table_says_why_row_one_is_first_and_what_the_band_is() -> None:
    """README's first command: row 1 is predicted slower than rows below it (the tie-break); the table
    marks it and says why in place, and names the band; host memory is named by what it holds."""
    r = runner.invoke(app, ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--seq-len",
                            "8192", "--global-batch", "512"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if re.match(r"^│\s+\d\*? │", line)]
    out = " ".join(r.output.split())  # captions and sentences wrap at the console's width
    steps = [float(line.split("│")[3]) for line in rows]
    if any(s < steps[0] for s in steps[1:]):
        assert rows[0].lstrip("│ ").startswith("1*")
        assert "* #1 is predicted up to" in out and "a tie, broken towards fewer moving parts" in out
    else:
        assert steps == sorted(steps)
    assert "MFU (band): the prediction, then the 10th-90th percentile" in out
    assert "offloaded state of 8 ranks" not in out
    assert "Host memory:" in out and ("loading peak" in out or "offloaded state of the node's" in out)
    assert "processs" not in out


def test_one_gpu_plan_speaks_in_the_singular() -> None:
    r = runner.invoke(app, ["plan", "--model", "llama-65b", "--cluster", "l40s-pcie-8", "--gpus", "1", "--seq-len", "512",
                            "--global-batch", "16", "--method", "qlora", "--framework", "fsdp"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "on 1 GPU of l40s-pcie-8" in r.output and "1 GPUs" not in r.output and "1 ranks" not in r.output
    assert "1 processes" not in r.output


@pytest.mark.parametrize("command", ["plan", "evaluate", "run", "models", "clusters", "serve", "tokens", "agent"])
def test_help_is_readable_at_100_columns(command: str) -> None:
    r = runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output and "…" not in r.output
    assert max(len(line) for line in r.output.splitlines()) <= 100


def test_export_help_names_every_format() -> None:
    from planner.exporters import formats

    r = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    text = " ".join(r.output.split("--export", 1)[1].split("--help", 1)[0].split())  # the option's wrapped help
    assert all(f" {fmt} " in f" {text.replace('|', ' ')} " for fmt in formats()), text


def test_every_option_has_help() -> None:
    import click
    import typer.main

    def missing(cmd: click.Command, path: str) -> list[str]:
        if isinstance(cmd, click.Group):
            return [m for name, sub in cmd.commands.items() for m in missing(sub, f"{path} {name}")]
        return [f"{path} {p.opts[0]}" for p in cmd.params if isinstance(p, click.Option) and not p.help and p.opts[0] != "--help"]

    assert missing(typer.main.get_command(app), "autopar") == []
