"""Source families of the published runs, and the calibration fitted without a row's family.

`bench.fit_calibration` groups the calibration rows into source families (the same team and
software) and stores, per family, the stack constants refitted without it (`lofo_calibrations` in
`cost_models/data/calibration.json`). The reports that price a row with the calibration that never
saw its family (`bench.calibration_report --split lofo`, `bench.published_vs_plan --holdout`) and
the fit itself read both from here, so neither report imports the fit.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from bench.calibration_rows import CalibrationRow, stratum
from cost_models.calibration import FITTED_PATH, Calibration, Overlap, Stack, default_calibration

FAMILIES: dict[str, str] = {
    "megatron_readme_h100": "NVIDIA Megatron-LM README",
    "narayanan2021_table1": "Megatron papers 2021-22",
    "narayanan2021_table2/megatron": "Megatron papers 2021-22",
    "korthikanti2022": "Megatron papers 2021-22",
    "narayanan2021_table2/deepspeed": "DeepSpeed ZeRO-3 (2021)",
    "llmfoundry_mpt": "MosaicML llm-foundry",
    "nemo_perf_2407": "NVIDIA NeMo performance summaries",
    "nemo_longseq_h100": "NVIDIA NeMo performance summaries",
    "mcore_moe_readme": "NVIDIA NeMo performance summaries",
    "dgxc_benchmarking": "NVIDIA DGX Cloud recipes",
    "torchtitan_2412": "torchtitan",
    "autopar_runtime_h200": "autopar runtime (H200, 2026-11)",
}
"""Source family of each stratum: sources written by the same team with the same software. A
stratum not named here is a family of its own."""


def family(row: CalibrationRow) -> str:
    return FAMILIES.get(stratum(row), stratum(row))


def lofo_calibration(row: CalibrationRow, path: Path = FITTED_PATH) -> Calibration:
    """The calibration that never saw `row`'s family (stored by the fit); the full fit for a family
    it did not name (never fitted on)."""
    doc = _stored(path)
    base = default_calibration() if path == FITTED_PATH else Calibration.from_json(doc["calibration"])
    entry = doc.get("lofo_calibrations", {}).get(family(row))
    if entry is None:
        return base
    stacks = {k: Stack(**v) for k, v in entry["stacks"].items()}
    ov = dict(base.overlaps)
    ov["deepspeed"] = replace(ov.get("deepspeed", Overlap()), bus_efficiency=float(entry["deepspeed_bus_efficiency"]))
    return replace(base, stacks=stacks, overlaps=ov, source=f"fitted without family {family(row)!r}")


_STORED: dict[Path, dict] = {}


def _stored(path: Path) -> dict:
    if path not in _STORED:
        _STORED[path] = json.loads(path.read_text()) if path.exists() else {}
    return _STORED[path]


def forget_stored(path: Path) -> None:
    """Drop the memo of `path` (after the fit rewrote it)."""
    _STORED.pop(path, None)
