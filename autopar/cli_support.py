"""What the console script needs besides its commands: telling a user which extra to install
instead of a ModuleNotFoundError traceback, reading a cluster file with errors a user can act on,
progress for steps that take more than a second, and the end-of-run summary of `autopar run`
(measured figures, rounded, beside the plan's prediction). Imports only typer, rich and the
standard library at module level."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

GIB = 2**30
EXTRA_HINT = {
    "api": "the api extra (FastAPI, uvicorn, SQLAlchemy, Alembic, httpx)",
    "runtime": "the runtime extra (torch 2.13.0)",
}


def module_present(name: str) -> bool:
    """Whether `import name` would find the module, without importing it (a None entry in
    sys.modules, as `python -X importtime` or a test's monkeypatch leaves it, counts as absent)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require_extra(extra: str, command: str, modules: Sequence[str]) -> None:
    """Exit with code 1 and "install autopar[extra]" when one of `modules` is not installed."""
    missing = [m for m in modules if not module_present(m)]
    if not missing:
        return
    typer.echo(
        f"error: `autopar {command}` needs {EXTRA_HINT.get(extra, extra)}, which is not installed "
        f"(missing: {', '.join(missing)}).\n"
        f"       install autopar[{extra}]:  pip install 'autopar[{extra}]'  (from a checkout: pip install -e '.[{extra}]')",
        err=True,
    )
    raise typer.Exit(1)


# ---- cluster files ------------------------------------------------------------------------------
CLUSTER_FILE_HELP = (
    "a cluster is a preset name (`autopar clusters`) or a YAML file of ClusterSpec fields, or of a "
    "'preset' and the fields that differ from it "
    "(README, 'Cluster files'; `autopar clusters --show dgx-h100 > my.yaml` writes one to edit)"
)


def looks_like_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml", ".json")) or "/" in ref or "\\" in ref


def read_cluster_file(path: Path) -> dict[str, Any]:
    """The mapping of ClusterSpec fields in a cluster YAML file. Also accepts an entry copied from
    the preset file as it is (`clusters: {NAME: {...}}`, or `NAME: {...}`): the key becomes the
    name. Raises typer.BadParameter with what is wrong and what a cluster file looks like."""
    import yaml

    if not path.is_file():
        raise typer.BadParameter(f"cluster file not found: {path} ({CLUSTER_FILE_HELP})", param_hint="--cluster")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"cannot read {path} as YAML: {exc}", param_hint="--cluster") from exc
    if isinstance(data, Mapping) and set(data) == {"clusters"} and isinstance(data["clusters"], Mapping):
        data = data["clusters"]
    if isinstance(data, Mapping) and "gpu" not in data and "preset" not in data and len(data) == 1:
        (key, value), = data.items()
        if isinstance(value, Mapping) and "gpu" in value:
            data = {"name": str(key), **value}
    if not isinstance(data, Mapping) or ("gpu" not in data and "preset" not in data):
        raise typer.BadParameter(
            f"{path} holds no cluster: expected a mapping with at least 'gpu' and 'gpus_per_node', or a 'preset' "
            f"and the fields that differ from it ({CLUSTER_FILE_HELP})",
            param_hint="--cluster",
        )
    if "preset" in data and "name" not in data:
        return dict(data)  # named <preset>-custom (`cluster_specs.presets.cluster_from_dict`)
    return {"name": path.stem, **data}


def preset_cluster_yaml(name: str) -> str:
    """A preset as a cluster file: its entry in the preset file, anchors expanded, vendor units,
    with its name; `--cluster FILE` (and POST /v1/clusters) load it back to the same ClusterSpec."""
    import yaml

    from cluster_specs.presets import preset_entry

    key, entry = preset_entry(name)
    body = yaml.safe_dump({"name": key, **entry}, sort_keys=False, allow_unicode=True, width=110)
    return (
        f"# autopar cluster file (preset {key}). Edit, save as {key}.yaml, then: autopar plan --cluster {key}.yaml ...\n"
        "# Units: bandwidth as '400 Gb/s' or '368 GB/s' (one direction), latency as '4 us', memory as '2 TiB';\n"
        "# gpu: a catalog name (`autopar gpus`). Field reference: README, 'Cluster files'.\n" + body
    )


# ---- progress -----------------------------------------------------------------------------------
@contextlib.contextmanager
def busy(message: str, enabled: bool | None = None) -> Iterator[None]:
    """A spinner on stderr while a step runs (only on a terminal; nothing in pipes and tests)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message):
        yield


def read_progress(path: Path) -> dict[str, Any] | None:
    """runtime.launch's --progress-file ({"step", "steps", "loss", "step_s"}), None while absent."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "step" in data else None


def run_with_progress(
    argv: list[str], env: dict[str, str], progress_file: Path, log_file: Path, steps: int, poll_s: float = 0.5
) -> int:
    """Run the torchrun line with its output in `log_file`, showing a spinner until the first step
    is done, then a bar with the step, the loss and the last step time; returns the exit code."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress_file.unlink(missing_ok=True)
    console = Console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} steps"), TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
    with log_file.open("wb") as log, Progress(*columns, console=console, transient=False,
                                              disable=not console.is_terminal) as bar:
        task = bar.add_task("starting torchrun (process group, model build)", total=steps, detail="")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)  # argv list: no shell
        reported = -1
        while proc.poll() is None:
            time.sleep(poll_s)
            p = read_progress(progress_file)
            if p is None or p["step"] == reported:
                continue
            reported = int(p["step"])
            loss = p.get("loss")
            detail = f"loss {loss:.3f}" if isinstance(loss, int | float) and math.isfinite(loss) else ""
            if isinstance(p.get("step_s"), int | float):
                detail += f", last step {p['step_s']:.3f} s"
            bar.update(task, description="training", completed=reported, total=int(p.get("steps") or steps), detail=detail)
            if not console.is_terminal:
                typer.echo(f"step {reported}/{p.get('steps') or steps} {detail}".rstrip(), err=True)
        if proc.returncode == 0:
            bar.update(task, description="done", completed=steps)
        return int(proc.returncode)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


# ---- end-of-run summary -------------------------------------------------------------------------
def _rel(measured: float | None, predicted: float | None) -> str:
    if measured is None or not predicted:
        return "n/a"
    return f"{100 * (measured - predicted) / predicted:+.1f}%"


def _startup_lines(profile: Mapping[str, Any]) -> list[str]:
    """Start-up seconds and host peak RSS (max over ranks), beside the cost model's host prediction
    (`host_memory_predicted_bytes`, the process itself not counted); nothing for a profile of an
    older runtime that has neither."""
    def known(key: str) -> list[float]:
        return [v for v in profile.get(key) or [] if isinstance(v, int | float)]

    startup, rss = known("startup_s_per_rank"), known("host_peak_rss_bytes_per_rank")
    lines = []
    if startup:
        phases = {k: max((x for x in v if isinstance(x, int | float)), default=0.0)
                  for k, v in (profile.get("startup_phases_s") or {}).items() if isinstance(v, list)}
        detail = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in phases.items())
        lines.append(f"start-up: {max(startup):.1f} s from process start to the first step (max over {len(startup)} "
                     f"ranks{'; slowest rank per phase: ' + detail if detail else ''})")
    if rss:
        line = f"host peak RSS: {max(rss) / GIB:.2f} GiB (max over {len(rss)} ranks)"
        pred = profile.get("host_memory_predicted_bytes")
        if isinstance(pred, int | float):
            line += (f" vs {pred / GIB:.2f} GiB predicted per rank (cost model, without the process itself: "
                     f"{(max(rss) - pred) / GIB:+.2f} GiB)")
        lines.append(line)
    return lines


def run_summary(profile: Mapping[str, Any], plan: Mapping[str, Any] | None) -> list[str]:
    """The lines `autopar run` prints at the end: measured figures, rounded and with units, and
    predicted vs measured step time and peak memory when the input was a Plan (its best layout's
    Estimate); last, start-up seconds and host peak RSS with the host memory predicted per rank
    (`_startup_lines`). Memory: predicted = worst pipeline stage's total less the allocator
    reserve; measured = max over ranks."""
    step_s = profile.get("step_s")
    times = [t for t in profile.get("step_times_s") or [] if isinstance(t, int | float)]
    peaks = [p for p in profile.get("peak_memory_bytes_per_rank") or [] if isinstance(p, int | float)]
    peak = max(peaks) if peaks else None
    tps, mfu = profile.get("tokens_per_s"), profile.get("mfu")
    losses = profile.get("losses") or []
    warm = profile.get("warmup_steps", 0)
    parts = [f"measured: {len(times)} step" + ("s" if len(times) != 1 else "")]
    if step_s is not None:
        spread = f", median {statistics.median(times[warm:] or times):.3f} s" if times else ""
        parts.append(f"step {step_s:.3f} s (mean after {warm} warm-up step{'s' if warm != 1 else ''}{spread})")
    if tps is not None:
        parts.append(f"{tps:,.0f} tokens/s")
    if mfu is not None:
        parts.append(f"MFU {100 * mfu:.1f}%")
    if peak is not None:
        over = f"{len(peaks)} rank" + ("s" if len(peaks) != 1 else "")
        parts.append(f"peak memory {peak / GIB:.2f} GiB (max over {over}, {profile.get('memory_source', 'measured')})")
    if losses:
        parts.append(f"final loss {losses[-1]:.4f}")
    lines = [", ".join(parts)]
    est = ((plan or {}).get("best") or {}).get("estimate") if plan else None
    if not est:
        lines.append("predicted vs measured: the input is a RunSpec, not a Plan: no prediction to compare with")
        return lines + _startup_lines(profile)
    pred_step = est.get("step_s")
    stages = (est.get("memory") or {}).get("stages") or []
    # allocated memory, as both memory sources measure it (CUDA max_memory_allocated, the CPU
    # live-storage tracker): the stage total less the caching allocator's reserve
    pred_peak = max((s.get("total_bytes", 0) - s.get("reserve_bytes", 0) for s in stages), default=None)
    pred = f"step {pred_step:.3f} s" if pred_step is not None else "step n/a"
    meas = f"{step_s:.3f} s" if step_s is not None else "n/a"
    line = f"predicted vs measured: step {pred.removeprefix('step ')} vs {meas} ({_rel(step_s, pred_step)})"
    gpu = (((plan or {}).get("inputs") or {}).get("cluster") or {}).get("gpu") or {}
    if pred_peak is not None and "CPU" in str(profile.get("memory_source", "")) and gpu.get("vendor", "cpu") != "cpu":
        line += (f"; peak memory not compared: measured by the CPU live-storage tracker, the plan predicts "
                 f"{gpu.get('name', 'GPU')} memory")
    elif pred_peak is not None:
        meas_peak = f"{peak / GIB:.2f} GiB" if peak is not None else "n/a"
        line += (f"; peak allocated memory {pred_peak / GIB:.2f} GiB (worst stage, without the allocator reserve) "
                 f"vs {meas_peak} ({_rel(peak, pred_peak)})")
    lines.append(line)
    return lines + _startup_lines(profile)
