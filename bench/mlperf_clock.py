"""GB200's sustained tensor-core clock, derived from MLPerf Training v5.0 with communication counted.

    python -m bench.mlperf_clock [--json]

MLPerf Training v5.0 (closed division, June 2025; github.com/mlcommons/training_results_v5.0)
trains Llama 3.1 405B at FP8 with one NeMo recipe on H100 (NVIDIA "Eos"), H200 (Nebius) and GB200
NVL72 (NVIDIA "Tyche", IBM + CoreWeave "Carina"), and logs every step's time (mlperf-common's
`tracked_stats` / `train_step_time`). `data/calibration/mlperf_training_v5_llama31_405b.csv` holds
each system's layout (from its `config_*.sh`: TP, PP, interleaving, CP, MINIBS x data-parallel
replicas = global batch) and the median step over all its result files. No row of that file is in
`published_runs.csv`, and the calibration fit never reads it.

Each run is priced with its cluster preset, the recipe's Megatron-Core options (distributed
optimizer, TP communication overlap, the embedding and loss in pipeline slots) and the stored
calibration. Measured / predicted tokens/s says how far the model is from each machine. The
calibration is fitted on A100 and H100 rows, none GB200, and each GPU's measured matmul share
(`GPUSpec.matmul_share`) already prices what a best-case matmul reaches; so GB200's
`sustained_clock_fraction` is what is left: the value at which the GB200 runs sit where the H100
runs sit, median measured / predicted over the GB200 runs equal to the median over the H100 runs. Only the kernel times scale with the clock (communication, pipeline bubble and host
time do not), so the value is found by bisection, not by dividing peaks. The H200 runs are printed
as a check on the Hopper side.

What it cannot separate: the GB200 submissions run full-iteration CUDA graphs and the H100 ones do
not (`FULL_CUDA_GRAPH`, config_common_cg.sh), and they use a container three months newer (NGC 25.04
against 25.01). Both make GB200 look faster than its kernels are, so the derived fraction is
an upper estimate of the kernel rate. It replaced 0.871 = 2.2 / 2.53, NVIDIA's MLPerf speed-up
per GPU over the peak ratio. That figure credited all of the speed-up to the kernels, including
what comes from NVL72's faster communication and from TP4 instead of TP8.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster_specs.presets import get_cluster
from cluster_specs.spec import ClusterSpec
from cost_models.calibration import Calibration, default_calibration
from cost_models.estimate import estimate
from cost_models.layout import Layout
from model_specs.presets import get_model
from model_specs.spec import TrainingSpec

DATA = Path(__file__).resolve().parent.parent / "data" / "calibration" / "mlperf_training_v5_llama31_405b.csv"
MODEL = "llama3-405b"
"""The preset every run of `DATA` trains (MLPerf's Llama 3.1 405B: the Llama 3 405B shape)."""
REFERENCE_FAMILY = "H100-80GB"
"""The GPU whose runs anchor the comparison: a GPU the calibration is fitted on (A100 and H100 rows)."""
TARGET_FAMILY = "GB200"


@dataclass(frozen=True)
class MlperfRun:
    """One MLPerf system's Llama 3.1 405B run: its layout and median measured step (seconds)."""

    system: str
    gpu_family: str
    cluster_preset: str
    gpus: int
    global_batch: int
    seq_len: int
    tp: int
    pp: int
    vpp: int
    cp: int
    micro_batch: int
    precision: str  # TrainingSpec.precision of the run
    median_step_s: float

    @property
    def measured_tokens_per_s_per_gpu(self) -> float:
        return self.global_batch * self.seq_len / self.median_step_s / self.gpus

    def layout(self) -> Layout:
        """The recipe's layout: Megatron-Core with the distributed optimizer (USE_DIST_OPTIMIZER),
        TP communication overlap (TP_COMM_OVERLAP) and the embedding and loss each in a pipeline
        slot (ASYM_PP_EMBED / ASYM_PP_LOSS: 126 layers + 2 = 8 x 8 x 2 chunks)."""
        dp = self.gpus // (self.tp * self.pp * self.cp)
        return Layout(
            tp=self.tp, pp=self.pp, vpp=self.vpp, cp=self.cp, dp=dp, zero_stage=1, micro_batch=self.micro_batch,
            framework="megatron", tp_comm_overlap=True,
            account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
        )


def load_runs(path: Path = DATA) -> list[MlperfRun]:
    with path.open(newline="") as f:
        return [
            MlperfRun(
                system=r["system"], gpu_family=r["gpu_family"], cluster_preset=r["cluster_preset"],
                gpus=int(r["gpus"]), global_batch=int(r["global_batch_seqs"]), seq_len=int(r["seq_len"]),
                tp=int(r["tp"]), pp=int(r["pp"]), vpp=int(r["vpp"]), cp=int(r["cp"]),
                micro_batch=int(r["micro_batch"]), precision=r["precision"].lower(), median_step_s=float(r["median_step_s"]),
            )
            for r in csv.DictReader(f)
        ]


def with_clock(cluster: ClusterSpec, fraction: float) -> ClusterSpec:
    """`cluster` with its GPU's `sustained_clock_fraction` replaced."""
    return cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"sustained_clock_fraction": fraction})})


def measured_over_predicted(run: MlperfRun, cal: Calibration, clock: float | None = None) -> float:
    """Measured / predicted tokens/s/GPU of `run` (above 1: the model is pessimistic), with the
    preset's clock fraction or `clock`."""
    cluster = get_cluster(run.cluster_preset)
    if clock is not None:
        cluster = with_clock(cluster, clock)
    training = TrainingSpec(seq_len=run.seq_len, global_batch=run.global_batch, precision=run.precision)
    e = estimate(get_model(MODEL), training, cluster, run.gpus, run.layout(), calibration=cal)
    return run.measured_tokens_per_s_per_gpu / e.tokens_per_s_per_gpu


def family_median(runs: list[MlperfRun], family: str, cal: Calibration, clock: float | None = None) -> float:
    return statistics.median(measured_over_predicted(r, cal, clock) for r in runs if r.gpu_family == family)


def derive_clock_fraction(runs: list[MlperfRun], cal: Calibration, lo: float = 0.5, hi: float = 1.0) -> float:
    """The `sustained_clock_fraction` of `TARGET_FAMILY` at which its runs' median measured /
    predicted equals the reference family's. A lower fraction slows the predicted kernels, so the
    target's ratio rises with it; bisection to 1e-4."""
    anchor = family_median(runs, REFERENCE_FAMILY, cal)
    for _ in range(14):
        mid = (lo + hi) / 2
        if family_median(runs, TARGET_FAMILY, cal, mid) > anchor:
            lo = mid  # predicted too slow: the clock is higher
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the runs and the derived fraction as JSON")
    a = ap.parse_args(argv)
    cal, runs = default_calibration(), load_runs()
    rows = [{**asdict(r), "measured_tokens_per_s_per_gpu": r.measured_tokens_per_s_per_gpu,
             "measured_over_predicted": measured_over_predicted(r, cal)} for r in runs]
    preset = get_cluster(next(r.cluster_preset for r in runs if r.gpu_family == TARGET_FAMILY)).gpu.sustained_clock_fraction
    derived = derive_clock_fraction(runs, cal)
    medians = {fam: statistics.median(x["measured_over_predicted"] for x in rows if x["gpu_family"] == fam)
               for fam in dict.fromkeys(r.gpu_family for r in runs)}
    if a.json:
        print(json.dumps({"runs": rows, "medians": medians, "preset_fraction": preset, "derived_fraction": derived}, indent=2))
        return 0
    print(f"{'system':44s} {'GPU':11s} {'GPUs':>5s} {'GBS':>5s} {'layout':>16s} {'step s':>7s} {'tok/s/GPU':>9s} {'meas/pred':>9s}")
    for x in rows:
        lay = f"tp{x['tp']} pp{x['pp']}x{x['vpp']} cp{x['cp']}"
        print(f"{x['system']:44s} {x['gpu_family']:11s} {x['gpus']:5d} {x['global_batch']:5d} {lay:>16s} "
              f"{x['median_step_s']:7.2f} {x['measured_tokens_per_s_per_gpu']:9.1f} {x['measured_over_predicted']:9.3f}")
    print("median measured / predicted: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    print(f"{TARGET_FAMILY} sustained_clock_fraction: preset {preset:.3f}, derived {derived:.3f} "
          f"(its runs then sit where the {REFERENCE_FAMILY} runs sit)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
