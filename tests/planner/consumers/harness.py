"""Running a consumer check: write each plan's export (and the files it names beside it), run a
`check_*.py` script of this directory on the manifest in a subprocess, and return what the
framework read back, per plan. Used by tests/planner/test_exporters.py and bench/export_consumers.py,
and meant for any exporter's tests (import it by path: `importlib.util.spec_from_file_location`, as
test_exporters.py does, since pytest's importlib mode gives test directories no package).

A check script prints one `RESULT {json}` line per manifest entry: `{"name", "ok", "error", "values"}`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def torchtitan_03_path() -> Path:
    """Where scripts/test.sh installs torchtitan 0.3.0 and the imports of its config loader
    (`pip install --no-deps --target`): AUTOPAR_TORCHTITAN_03, default .venv/torchtitan-0.3."""
    return Path(os.environ.get("AUTOPAR_TORCHTITAN_03", REPO / ".venv" / "torchtitan-0.3"))


ENVIRONMENTS: dict[str, Callable[[], dict[str, str]]] = {
    # torchtitan 0.3.0 beside 0.2.2: its own directory first on the path, in the subprocess only
    "torchtitan_03": lambda: {"PYTHONPATH": os.pathsep.join(
        [str(torchtitan_03_path()), *filter(None, [os.environ.get("PYTHONPATH")])]
    )},
}


def write_exports(
    plans: Mapping[str, Any], fmt: str, root: Path, export: Callable[[Any, str], Any], beside: Mapping[str, str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Write every plan's `fmt` export under root/<name>/ (and, for each `beside` format, that export
    too: Accelerate's DeepSpeed plugin reads the plan's ds_config.json from its launch directory).
    Returns the manifest entries and, per plan, the export error when it has none to write."""
    manifest, refused = [], {}
    for name, plan in plans.items():
        try:
            result = export(plan, fmt)
        except ValueError as exc:  # ExportError: the format cannot express this plan at all
            refused[name] = str(exc)
            continue
        (root / name).mkdir(parents=True, exist_ok=True)
        path = root / name / result.filename
        path.write_text(result.text)
        for other in (beside or {}).values():
            extra = export(plan, other)
            (root / name / extra.filename).write_text(extra.text)
        lay = plan.best.layout
        manifest.append({
            "name": name, "path": str(path), "gpus": plan.inputs.gpus, "tp": lay.tp, "pp": lay.pp,
            "vocab_size": plan.inputs.model.vocab_size, "num_layers": plan.inputs.model.num_layers,
        })
    return manifest, refused


def run_check(script: str, manifest: list[dict[str, Any]], root: Path, environment: str | None = None,
              timeout_s: float = 900) -> dict[str, dict[str, Any]]:
    """Run tests/planner/consumers/<script> on `manifest`; every entry's RESULT by name. Raises
    AssertionError when the script dies or leaves an entry without a result."""
    (root / "manifest.json").write_text(json.dumps(manifest))
    env = {**os.environ, **(ENVIRONMENTS[environment]() if environment else {})}
    proc = subprocess.run(
        [sys.executable, str(HERE / script), str(root / "manifest.json")],
        capture_output=True, text=True, timeout=timeout_s, env=env,
    )
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == len(manifest), (proc.returncode, proc.stderr[-4000:])
    return {r["name"]: r for r in results}
