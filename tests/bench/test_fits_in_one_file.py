"""The two fits that write cost_models/data/calibration.json keep each other's fields:
`bench.fit_calibration` (the framework `Stack` constants, DeepSpeed's bus efficiency, the held-out
figures and bands) and `bench.finetune_runs --fit` (`Calibration.stack_overheads`, the stacks' own
kernel-time stretch among them)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from bench import finetune_runs as fr
from bench import fit_calibration as fc
from cost_models.calibration import FITTED_PATH, Calibration, StackOverhead

OVERHEADS = {"hf": StackOverhead(step_s=0.123, micro_batch_s=0.0045, kernel_launch_s=2.5e-5, compute=1.07),
             "torchtune": StackOverhead(step_s=0.0, micro_batch_s=0.002, kernel_launch_s=1.1e-5)}
"""A stack with its own kernel-time stretch (`StackOverhead.compute`) and one with the prior (None)."""


def _stored(tmp_path: Path) -> Path:
    path = tmp_path / "calibration.json"
    path.write_text(FITTED_PATH.read_text())
    return path


def test_the_stack_overheads_fit_leaves_every_other_field(tmp_path: Path) -> None:
    path = _stored(tmp_path)
    before = json.loads(path.read_text())
    fr.write_overheads(OVERHEADS, path)
    after = json.loads(path.read_text())
    assert after["calibration"]["stack_overheads"] == {k: asdict(v) for k, v in OVERHEADS.items()}
    assert "bench/finetune_runs.py --fit" in after["fitted_elsewhere"]["stack_overheads"]
    for key in before:
        if key not in ("calibration", "fitted_elsewhere"):
            assert after[key] == before[key], key
    for key, value in before["calibration"].items():
        if key != "stack_overheads":
            assert after["calibration"][key] == value, key


def test_the_framework_fit_keeps_the_stored_stack_overheads(tmp_path: Path) -> None:
    """The framework fit starts from the stored overheads (`other_fits`) and writes them back as stored
    (`write_fit`), whatever its own calibration object carries."""
    path = _stored(tmp_path)
    fr.write_overheads(OVERHEADS, path)
    kept = fc.other_fits(path)
    assert kept == {"stack_overheads": OVERHEADS}
    doc = {"calibration": Calibration().to_json(), "fit": {"rows": 0}}  # prior overheads in the new document
    fc.write_fit(doc, path)
    after = json.loads(path.read_text())
    assert after["calibration"]["stack_overheads"] == {k: asdict(v) for k, v in OVERHEADS.items()}
    assert after["fitted_elsewhere"] == fc.FITTED_ELSEWHERE
    assert Calibration.from_json(after["calibration"]).stack_overhead("hf") == OVERHEADS["hf"]


def test_without_a_stored_file_the_framework_fit_starts_from_the_priors(tmp_path: Path) -> None:
    assert fc.other_fits(tmp_path / "absent.json") == {}


def test_the_stored_file_names_who_fits_what() -> None:
    doc = json.loads(FITTED_PATH.read_text())
    assert set(doc["fitted_elsewhere"]) == set(fc.FITTED_ELSEWHERE)
    assert set(doc["calibration"]["stack_overheads"]) == {"hf", "torchtune"}
    for stack, stored in doc["calibration"]["stack_overheads"].items():
        fit = doc["stack_overheads_fit"]["stacks"][stack]  # the stack's own stretch is stored only where kept
        assert (stored["compute"] is not None) == fit["compute_kept"] and stored == fit["stored"], stack
