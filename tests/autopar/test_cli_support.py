"""autopar.cli_support: extras detection, cluster files, the end-of-run summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import typer

from autopar.cli_support import module_present, read_cluster_file, read_progress, require_extra, run_summary

GIB = 2**30
PLAN = {"best": {"estimate": {"step_s": 0.2, "memory": {"stages": [
    {"total_bytes": 3 * GIB, "reserve_bytes": GIB}, {"total_bytes": 4 * GIB, "reserve_bytes": GIB},
]}}}}
PROFILE = {
    "step_times_s": [0.512345, 0.2512345, 0.2487654], "step_s": 0.25, "warmup_steps": 1,
    "peak_memory_bytes_per_rank": [int(2.5 * GIB), int(3.3 * GIB), None], "tokens_per_s": 4096.4321, "mfu": 0.123456,
    "losses": [6.5, 6.25, 6.123456], "memory_source": "cuda.max_memory_allocated",
}


def test_module_present_sees_installed_and_hidden_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    assert module_present("json") and not module_present("no_such_module_autopar")
    monkeypatch.setitem(sys.modules, "json", None)
    assert not module_present("json")


def test_require_extra_exits_with_the_install_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    require_extra("api", "serve", ["json"])  # present: no exit
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(typer.Exit) as exc:
        require_extra("api", "serve", ["json", "uvicorn"])
    assert exc.value.exit_code == 1
    err = capsys.readouterr().err
    assert "missing: uvicorn" in err and "pip install 'autopar[api]'" in err and "pip install -e '.[api]'" in err


def test_summary_rounds_and_sets_prediction_beside_measurement() -> None:
    measured, versus = run_summary(PROFILE, PLAN)
    assert measured == (
        "measured: 3 steps, step 0.250 s (mean after 1 warm-up step, median 0.250 s), 4,096 tokens/s, MFU 12.3%, "
        "peak memory 3.30 GiB (max over 2 ranks, cuda.max_memory_allocated), final loss 6.1235"
    )
    # memory: worst stage total less the allocator reserve = 3 GiB; measured 3.3 GiB -> +10.0%
    assert versus == (
        "predicted vs measured: step 0.200 s vs 0.250 s (+25.0%); peak allocated memory 3.00 GiB "
        "(worst stage, without the allocator reserve) vs 3.30 GiB (+10.0%)"
    )


def test_summary_ends_with_start_up_and_host_memory() -> None:
    profile = {
        **PROFILE, "startup_s_per_rank": [12.34, 15.06, None], "host_peak_rss_bytes_per_rank": [3 * GIB, int(3.5 * GIB)],
        "startup_phases_s": {"build_s": [0.5, 0.75], "init_s": [2.0, 1.5]}, "host_memory_predicted_bytes": 3 * GIB,
    }
    startup, rss = run_summary(profile, PLAN)[-2:]
    assert startup == ("start-up: 15.1 s from process start to the first step (max over 2 ranks; slowest rank per "
                       "phase: build 0.8 s, init 2.0 s)")
    assert rss == ("host peak RSS: 3.50 GiB (max over 2 ranks) vs 3.00 GiB predicted per rank (cost model, without "
                   "the process itself: +0.50 GiB)")
    assert run_summary(profile, None)[-1] == rss


def test_summary_of_a_runspec_says_there_is_no_prediction() -> None:
    lines = run_summary({"step_times_s": [], "step_s": None}, None)
    assert lines == ["measured: 0 steps", "predicted vs measured: the input is a RunSpec, not a Plan: no prediction to compare with"]


def test_read_progress_tolerates_absent_and_partial_files(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    assert read_progress(path) is None
    path.write_text('{"step": 2, "ste')
    assert read_progress(path) is None
    path.write_text('{"step": 2, "steps": 5, "loss": 1.5, "step_s": 0.1}')
    assert read_progress(path) == {"step": 2, "steps": 5, "loss": 1.5, "step_s": 0.1}


def test_cluster_file_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(typer.BadParameter, match="cluster file not found"):
        read_cluster_file(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: [unclosed\n")
    with pytest.raises(typer.BadParameter, match="cannot read .* as YAML"):
        read_cluster_file(bad)
    minimal = tmp_path / "rack.yaml"
    minimal.write_text("gpu: H100-80GB\ngpus_per_node: 8\nintra_node: {kind: nvswitch, bus_bandwidth: 368 GB/s}\n")
    assert read_cluster_file(minimal)["name"] == "rack"  # the file's stem names it


def test_summary_does_not_compare_a_cpu_run_with_a_gpu_prediction() -> None:
    """A plan for H100 run on a CPU machine: the live-storage tracker measures host tensors, not the H100's
    memory, so no percentage; on a CPU plan (local-cpu) the same tracker is compared."""
    cpu = {**PROFILE, "memory_source": "live-storage tracker (CPU)"}
    h100 = {**PLAN, "inputs": {"cluster": {"gpu": {"name": "H100-80GB", "vendor": "nvidia"}}}}
    versus = run_summary(cpu, h100)[1]
    assert versus.endswith("peak memory not compared: measured by the CPU live-storage tracker, the plan predicts H100-80GB memory")
    local = {**PLAN, "inputs": {"cluster": {"gpu": {"name": "cpu", "vendor": "cpu"}}}}
    assert run_summary(cpu, local)[1].endswith("vs 3.30 GiB (+10.0%)")
