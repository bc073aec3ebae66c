"""Refit one cluster's efficiency factors from the profiles its runs measured.

Input: pairs of (the Plan that priced a run, the Profile the run measured). From the Plan we take
the predicted time breakdown of the chosen layout (`best.estimate.time.breakdown`, seconds per
step: compute, recompute, exposed TP/CP/EP/PP/DP communication, bubble, optimizer, overhead) and
the tier of every mesh dimension's group as placed (`best.placement.groups[].tier`); from the
Profile the measured step time (`step_s`, mean over the steps after warm-up) and, when the agent
ran one, the pre-flight all-reduce bus bandwidth (`preflight.bus_bandwidth_bytes_per_s`).

Model (a first-order surrogate of `cost_models.estimate` around the global calibration):

    t_i(theta) = a_c * C_i + a_intra * M_intra,i + a_inter * M_inter,i + F_i + o

    C_i        compute-like seconds: compute + recompute + the optimizer step when it runs on the
               GPU (HBM-bound) + the compute share of the pipeline bubble
    M_tier,i   exposed communication seconds whose group runs over that tier (intra_domain ->
               intra; inter_node / inter_leaf -> inter) + the comm share of the bubble; the bubble
               is split in the proportion of compute to exposed TP/CP/EP/PP communication of the step
    F_i        seconds no fitted factor scales (an offloaded optimizer step: PCIe-bound)
    o          fixed seconds per step (`Calibration.step_overhead_s`)

Every compute time in `cost_models.compute` is a measured kernel time (`cost_models.kernels`) over
its efficiency multiplier, or bytes / (HBM x efficiency), so dividing `gemm_efficiency`,
`fp8_gemm_efficiency`, both attention efficiencies and `hbm_efficiency` by a_c (and multiplying the host's
`kernel_launch_s`, the floor of a layer's time, by a_c) multiplies every compute time by exactly a_c. Collective time is bytes / (bus bandwidth x tier efficiency) + latency
(`cost_models.comm`), so dividing `intra_bus_efficiency` (`inter_bus_efficiency`) by a_intra
(a_inter) multiplies the bandwidth part of that tier's collectives by a_tier; the latency part and
the overlap windows (max(0, comm - overlap x window)) make the surrogate approximate there, which
is why the report's "after" errors are computed by re-pricing each plan with `cost_models.estimate`
under the fitted calibration, not from the surrogate.

Method: maximum a posteriori estimate = regularized nonlinear least squares on log step time,
toward the global calibration (`default_calibration()`, fitted on published runs) as the prior:

    minimize  sum_i w_i (log t_i(theta) - log y_i)^2 / SIGMA_RUN^2
            + sum_tier [preflight] (log a_tier - log a_tier,obs)^2 / SIGMA_PREFLIGHT^2
            + sum_k (log a_k)^2 / SIGMA_PRIOR^2  +  (o - o_0)^2 / (SIGMA_OVERHEAD_REL x median y)^2

    y_i        measured step seconds; w_i = 1 (a profile is one observation; weights may be given)
    SIGMA_RUN  = 0.10: run-to-run spread of a step time on a shared host (log units, ~10%)
    SIGMA_PRIOR = 1.0: the prior lets each multiplier move by a factor e per standard deviation,
               so a handful of consistent profiles dominate it (with n profiles the data weigh
               n x 100 against the prior's 1)
    a_tier,obs = B_catalog x eff_global / B_measured: the pre-flight's bus bandwidth, measured by
               the NCCL convention (2(n-1)/n x bytes / t) over the planned ranks on one node, is a
               direct observation of the intra-domain tier; SIGMA_PREFLIGHT = 0.10
    o_0        the global `step_overhead_s`; SIGMA_OVERHEAD_REL = 0.25 (a quarter of a median step)

solved by Gauss-Newton with Levenberg damping over (log a_c, log a_intra, log a_inter, o), o kept
>= 0 by projection, inside iteratively reweighted least squares so that a few wrong profiles (a
broken timer's 1e-9 s step, a stalled run) cannot move the fit: each profile's weight is
multiplied by a robust weight of its standardized residual u = (log t_i - log y_i) / s, where
s = max(SIGMA_RUN, 1.4826 x MAD of the residuals) (the MAD is consistent with a standard deviation
at the normal and ignores a shift common to all profiles, which the fit itself absorbs). First
Huber weights min(1, HUBER_K / |u|) from the prior (a convex objective: one optimum whatever the
start; Huber 1964), then Tukey's biweight (1 - (u / TUKEY_C)^2)^2, 0 beyond TUKEY_C, from the
Huber optimum (a profile more than TUKEY_C scales off the fit weighs nothing; Beaton & Tukey
1974). Both constants give 95% efficiency at the normal. The profiles weighted below
`OUTLIER_WEIGHT` are reported as outliers by their label. Parameters the data cannot identify are held at the prior and reported so:
    a_c        needs one profile whose compute-like share is >= 5% of its predicted step
    a_tier     needs one profile whose exposed communication on that tier is >= 5% of its
               predicted step, or a pre-flight measurement on that tier
    o          needs >= 3 profiles whose compute-like seconds span a factor >= 1.5 (with one
               layout, or layouts of equal compute, a fixed cost and a compute scale are the same
               thing to the data)
    overlap    not identified: a step total cannot tell "slower link" from "less overlap" on the
               same tier without the raw (un-overlapped) communication volume, which the Plan does
               not store; the framework's overlap fractions stay at the global values (the tier
               multiplier absorbs both, so the prediction still moves).

Errors (percent of measured step time): before = the stored prediction (global calibration);
after, in-sample = every plan re-priced with the fitted calibration; leave-one-out (n >= 3) = each
profile predicted by a fit to the others. Without the plan's inputs a pair is scored with the
surrogate, and the report says which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from cost_models.calibration import Calibration, default_calibration

__all__ = [
    "CalibrationFit",
    "ErrorStats",
    "FactorReport",
    "ProfilePair",
    "fit_cluster_calibration",
    "reprice_step_s",
]

SIGMA_RUN = 0.10
SIGMA_PRIOR = 1.0
SIGMA_PREFLIGHT = 0.10
SIGMA_OVERHEAD_REL = 0.25
MIN_SHARE = 0.05
MIN_COMPUTE_SPREAD = 1.5
MULTIPLIER_BOUNDS = (1e-3, 1e3)  # a factor outside this is a unit error, not a calibration
HUBER_K = 1.345
"""Huber's tuning constant, in robust scales: 95% efficiency at the normal (Holland & Welsch 1977)."""
TUKEY_C = 4.685
"""Tukey's biweight constant, in robust scales: 95% efficiency at the normal (Beaton & Tukey 1974)."""
MAD_TO_SIGMA = 1.4826
"""1 / the normal's 75th percentile: the MAD times this estimates a standard deviation."""
ROBUST_ITERS = (20, 10)
"""IRLS passes: Huber, then Tukey (each pass a damped Gauss-Newton solve; they converge in a few)."""
OUTLIER_WEIGHT = 0.5
"""A profile whose robust weight ends below this is reported as an outlier."""
INTRA_TIERS = ("intra_domain",)
COMM_DIMS = ("tp", "cp", "ep", "pp", "dp")


def _tier_class(tier: str) -> str:
    return "intra" if tier in INTRA_TIERS else "inter"


@dataclass(frozen=True)
class ProfilePair:
    """One run: the prediction it was planned with and what it measured. Times in seconds."""

    breakdown: dict[str, float]  # Estimate time breakdown: compute_s, tp_comm_s, ..., overhead_s
    measured_step_s: float
    tiers: dict[str, str] = field(default_factory=dict)  # mesh dim -> placement tier
    offload_optimizer: bool = False
    preflight_bus_bandwidth_bytes_per_s: float | None = None
    catalog_intra_bus_bandwidth_bytes_per_s: float | None = None  # the cluster's intra-node figure
    job: dict[str, Any] | None = None  # plan inputs to re-price: model, cluster, gpus, training, layout, partition
    weight: float = 1.0
    label: str = ""

    @property
    def predicted_step_s(self) -> float:
        return float(sum(self.breakdown.values()))

    @classmethod
    def from_plan_and_profile(cls, plan: dict[str, Any], profile: dict[str, Any], label: str = "") -> ProfilePair:
        """Build a pair from a Plan JSON (`planner.plan.Plan`) and a Profile JSON
        (`runtime.train.make_profile`, plus the agent's optional `preflight`)."""
        best = plan.get("best") or {}
        est = best.get("estimate") or {}
        breakdown = {k: float(v) for k, v in ((est.get("time") or {}).get("breakdown") or {}).items()}
        step = profile.get("step_s")
        if not breakdown or step is None or not float(step) > 0:
            raise ValueError("a pair needs the plan's time breakdown and a positive measured step_s")
        tiers = {g["dim"]: g["tier"] for g in (best.get("placement") or {}).get("groups", []) if g.get("size", 1) > 1}
        layout = best.get("layout") or {}
        inputs = plan.get("inputs") or {}
        cluster = inputs.get("cluster") or {}
        catalog = (cluster.get("intra_node") or {}).get("bus_bandwidth_bytes_per_s") if isinstance(cluster, dict) else None
        pre = profile.get("preflight") or {}
        job = None
        if inputs.get("model") and cluster and layout:
            part = best.get("partition") or None
            job = {
                "model": inputs["model"], "cluster": cluster, "gpus": inputs.get("gpus"),
                "training": inputs.get("training"), "layout": layout, "partition": part,
            }
        return cls(
            breakdown=breakdown,
            measured_step_s=float(step),
            tiers=tiers,
            offload_optimizer=bool(layout.get("offload_optimizer", False)),
            preflight_bus_bandwidth_bytes_per_s=pre.get("bus_bandwidth_bytes_per_s"),
            catalog_intra_bus_bandwidth_bytes_per_s=catalog,
            job=job,
            label=label,
        )

    # ---- surrogate columns -------------------------------------------------------------------
    def columns(self) -> tuple[float, float, float, float, float]:
        """(C, M_intra, M_inter, F, o_0) seconds of the surrogate model (module docstring)."""
        b = self.breakdown
        comp = b.get("compute_s", 0.0) + b.get("recompute_s", 0.0)
        per_dim = {d: b.get(f"{d}_comm_s", 0.0) for d in COMM_DIMS}
        stage_comm = sum(per_dim[d] for d in ("tp", "cp", "ep", "pp"))
        bubble = b.get("bubble_s", 0.0)
        comm_share = stage_comm / (comp + stage_comm) if comp + stage_comm > 0 else 0.0
        c = comp + bubble * (1.0 - comm_share)
        m = {"intra": 0.0, "inter": 0.0}
        for d, t in per_dim.items():
            m[_tier_class(self.tiers.get(d, "intra_domain"))] += t
        if stage_comm > 0:  # the bubble's comm share goes to the tiers of the stage collectives
            for d in ("tp", "cp", "ep", "pp"):
                m[_tier_class(self.tiers.get(d, "intra_domain"))] += bubble * comm_share * per_dim[d] / stage_comm
        opt = b.get("optimizer_s", 0.0)
        fixed = 0.0
        if self.offload_optimizer:
            fixed += opt
        else:
            c += opt
        return c, m["intra"], m["inter"], fixed, b.get("overhead_s", 0.0)

    def preflight_multiplier(self, base: Calibration) -> float | None:
        """a_intra observed by the pre-flight: catalog x efficiency / measured (time multiplier)."""
        bw, cat = self.preflight_bus_bandwidth_bytes_per_s, self.catalog_intra_bus_bandwidth_bytes_per_s
        if not bw or not cat or bw <= 0 or cat <= 0:
            return None
        return cat * base.intra_bus_efficiency / bw


@dataclass(frozen=True)
class ErrorStats:
    """Percent errors of predicted vs measured step time: 100 x (predicted - measured) / measured."""

    n: int
    median_ape_pct: float
    mape_pct: float
    mean_signed_pct: float
    method: str  # "stored prediction" | "re-priced" | "surrogate" | "leave-one-out (...)"

    @classmethod
    def of(cls, predicted: Sequence[float], measured: Sequence[float], method: str) -> ErrorStats:
        p, y = np.asarray(predicted, float), np.asarray(measured, float)
        e = 100.0 * (p - y) / y
        return cls(int(e.size), float(np.median(np.abs(e))), float(np.mean(np.abs(e))), float(np.mean(e)), method)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FactorReport:
    name: str
    prior: float
    fitted: float
    identified: bool
    reason: str
    unit: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CalibrationFit:
    cluster: str
    calibration: Calibration
    n_profiles: int
    factors: list[FactorReport]
    multipliers: dict[str, float]  # time multipliers a_c, a_intra, a_inter (1 = global calibration)
    error_before: ErrorStats | None
    error_after: ErrorStats | None
    error_loo: ErrorStats | None
    method: str
    rejected: str | None = None  # why the fit was refused (`PLAUSIBLE`); the calibration is then `base`
    outliers: list[str] = field(default_factory=list)  # labels of the profiles the robust fit set aside

    def as_dict(self) -> dict[str, Any]:
        return {
            "rejected": self.rejected,
            "cluster": self.cluster,
            "source": self.calibration.source,
            "n_profiles": self.n_profiles,
            "factors": [f.as_dict() for f in self.factors],
            "time_multipliers": self.multipliers,
            "error_before": self.error_before.as_dict() if self.error_before else None,
            "error_after": self.error_after.as_dict() if self.error_after else None,
            "error_leave_one_out": self.error_loo.as_dict() if self.error_loo else None,
            "method": self.method,
            "outliers": list(self.outliers),
            "calibration": self.calibration.to_json(),
        }


METHOD = (
    "robust MAP fit (Gauss-Newton inside IRLS with Huber, then Tukey weights) of log step time = "
    "log(a_c*compute + a_intra*comm_intra + a_inter*comm_inter + fixed + overhead) to measured profiles, prior = "
    "global calibration (sigma_run 0.10, sigma_prior 1.0 in log units; pre-flight bus bandwidth observes a_intra "
    "with sigma 0.10); see cost_models/profile_calibration.py"
)


# ---- fit -------------------------------------------------------------------------------------------


@dataclass
class _Problem:
    X: np.ndarray  # (n, 5) columns C, M_intra, M_inter, F, o_0
    y: np.ndarray  # measured seconds
    w: np.ndarray
    free: np.ndarray  # (4,) bool: log a_c, log a_intra, log a_inter, o
    prior: np.ndarray  # (4,)
    sigma: np.ndarray  # (4,) prior standard deviations
    pre: list[float]  # observed log a_intra values


def _predict(X: np.ndarray, theta: np.ndarray) -> np.ndarray:
    a = np.exp(theta[:3])
    return X[:, 0] * a[0] + X[:, 1] * a[1] + X[:, 2] * a[2] + X[:, 3] + theta[3]


def _residuals(p: _Problem, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stacked residuals and their Jacobian in theta."""
    a = np.exp(theta[:3])
    t = np.maximum(_predict(p.X, theta), 1e-12)
    sw = np.sqrt(p.w) / SIGMA_RUN
    r_data = sw * (np.log(t) - np.log(p.y))
    J_data = np.zeros((len(t), 4))
    for k in range(3):
        J_data[:, k] = sw * p.X[:, k] * a[k] / t
    J_data[:, 3] = sw / t
    r_pre = np.array([(theta[1] - v) / SIGMA_PREFLIGHT for v in p.pre])
    J_pre = np.zeros((len(p.pre), 4))
    J_pre[:, 1] = 1.0 / SIGMA_PREFLIGHT
    r_prior = (theta - p.prior) / p.sigma
    J_prior = np.diag(1.0 / p.sigma)
    r = np.concatenate([r_data, r_pre, r_prior])
    J = np.vstack([J_data, J_pre, J_prior])
    return r, J[:, p.free] if p.free.any() else J[:, :0]


def _solve(p: _Problem, iters: int = 100, start: np.ndarray | None = None) -> np.ndarray:
    """Levenberg-damped Gauss-Newton on the free parameters; o projected to >= 0."""
    theta = (p.prior if start is None else start).copy()
    lo, hi = math.log(MULTIPLIER_BOUNDS[0]), math.log(MULTIPLIER_BOUNDS[1])
    if not p.free.any():
        return theta
    lam = 1e-3
    r, J = _residuals(p, theta)
    cost = float(r @ r)
    for _ in range(iters):
        g = J.T @ r
        H = J.T @ J
        step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), -g)
        cand = theta.copy()
        cand[p.free] += step
        cand[:3] = np.clip(cand[:3], lo, hi)
        cand[3] = max(cand[3], 0.0)
        r2, J2 = _residuals(p, cand)
        c2 = float(r2 @ r2)
        if c2 < cost:
            done = cost - c2 < 1e-12 * max(cost, 1.0)
            theta, r, J, cost = cand, r2, J2, c2
            lam = max(lam / 10, 1e-9)
            if done:
                break
        else:
            lam *= 10
            if lam > 1e9:
                break
    return theta


def _robust_weights(p: _Problem, theta: np.ndarray, kind: str) -> np.ndarray:
    """Huber or Tukey weights of the profiles' residuals at `theta` (module docstring)."""
    r = np.log(np.maximum(_predict(p.X, theta), 1e-12)) - np.log(p.y)
    scale = max(SIGMA_RUN, MAD_TO_SIGMA * float(np.median(np.abs(r - np.median(r)))))
    u = np.abs(r) / scale
    if kind == "huber":
        return np.minimum(1.0, HUBER_K / np.maximum(u, 1e-12))
    return np.where(u < TUKEY_C, (1.0 - (u / TUKEY_C) ** 2) ** 2, 0.0)


def _solve_robust(p: _Problem) -> tuple[np.ndarray, np.ndarray]:
    """The robust MAP fit (IRLS: Huber, then Tukey) and each profile's final robust weight."""
    theta = _solve(p)
    weights = np.ones(len(p.y))
    for kind, passes in zip(("huber", "tukey"), ROBUST_ITERS, strict=True):
        for _ in range(passes):
            new = _robust_weights(p, theta, kind)
            if kind == "tukey" and not (new > 0).any():
                break  # every profile off by TUKEY_C scales: keep the Huber fit
            reweighted = replace(p, w=p.w * new)
            moved = _solve(reweighted, start=theta)
            done = bool(np.allclose(new, weights, atol=1e-4)) and bool(np.allclose(moved, theta, atol=1e-7))
            theta, weights = moved, new
            if done:
                break
    return theta, weights


def _identify(X: np.ndarray, has_pre: bool) -> tuple[np.ndarray, list[str]]:
    total = X.sum(axis=1)
    share = X[:, :3] / total[:, None]
    free = np.zeros(4, bool)
    reasons: list[str] = []
    n = len(X)
    free[0] = bool((share[:, 0] >= MIN_SHARE).any())
    reasons.append(
        f"compute is >= {MIN_SHARE:.0%} of the predicted step in {int((share[:, 0] >= MIN_SHARE).sum())} of {n} profiles"
        if free[0] else f"no profile has compute >= {MIN_SHARE:.0%} of its step: held at the global value"
    )
    for k, tier in ((1, "intra-domain"), (2, "inter-node")):
        m = int((share[:, k] >= MIN_SHARE).sum())
        pre = has_pre and k == 1
        free[k] = m > 0 or pre
        if free[k]:
            parts = []
            if m:
                parts.append(f"{tier} exposed communication is >= {MIN_SHARE:.0%} of the step in {m} of {n} profiles")
            if pre:
                parts.append("pre-flight all-reduce bus bandwidth measured")
            reasons.append("; ".join(parts))
        else:
            reasons.append(f"no profile exposes >= {MIN_SHARE:.0%} {tier} communication and no pre-flight: held")
    comp = X[:, 0]
    spread = float(comp.max() / comp.min()) if n and comp.min() > 0 else 0.0
    free[3] = n >= 3 and spread >= MIN_COMPUTE_SPREAD
    reasons.append(
        f"{n} profiles whose compute spans x{spread:.2f}: fixed cost separable from compute scale"
        if free[3] else
        f"needs >= 3 profiles whose compute spans x{MIN_COMPUTE_SPREAD} (have {n}, x{spread:.2f}): held"
    )
    return free, reasons


def _problem(pairs: Sequence[ProfilePair], base: Calibration) -> tuple[_Problem, list[str]]:
    X = np.array([p.columns() for p in pairs], float)
    y = np.array([p.measured_step_s for p in pairs], float)
    w = np.array([p.weight for p in pairs], float)
    pre = [math.log(m) for p in pairs if (m := p.preflight_multiplier(base)) is not None]
    free, reasons = _identify(X, bool(pre))
    o0 = float(np.median(X[:, 4])) if len(X) else base.step_overhead_s
    prior = np.array([0.0, 0.0, 0.0, o0])
    sigma = np.array([SIGMA_PRIOR] * 3 + [max(SIGMA_OVERHEAD_REL * float(np.median(y)), 1e-6)])
    # columns exclude the overhead (it is theta[3]); X[:, 4] only sets its prior
    return _Problem(X, y, w, free, prior, sigma, pre), reasons


def _apply(base: Calibration, theta: np.ndarray, source: str, o0: float | None = None) -> Calibration:
    """`base` with the fitted multipliers. The fixed cost: the fitted o is the whole per-step overhead
    the plans priced (their stack's `Stack.step_s` + the cluster's `step_overhead_s`, `o0` the prior
    from them), so the cluster's own part moves by o - o0."""
    a_c, a_intra, a_inter = (float(math.exp(v)) for v in theta[:3])
    overhead = float(theta[3]) if o0 is None else max(0.0, base.step_overhead_s + float(theta[3]) - o0)
    return replace(
        base,
        gemm_efficiency=base.gemm_efficiency / a_c,
        fp8_gemm_efficiency=base.fp8_gemm_efficiency / a_c,
        attention_efficiency=base.attention_efficiency / a_c,
        flash2_attention_efficiency=base.flash2_attention_efficiency / a_c,
        hbm_efficiency=base.hbm_efficiency / a_c,
        kernel_launch_s=base.kernel_launch_s * a_c,
        intra_bus_efficiency=base.intra_bus_efficiency / a_intra,
        inter_bus_efficiency=base.inter_bus_efficiency / a_inter,
        step_overhead_s=overhead,
        source=source,
    )


def reprice_step_s(job: dict[str, Any], cal: Calibration) -> float:
    """Predicted step seconds of a stored plan's layout under `cal` (`cost_models.estimate`)."""
    from cost_models.estimate import estimate
    from cost_models.jobs import resolve_cluster, resolve_model
    from cost_models.layout import Layout
    from cost_models.stages import StagePartition
    from model_specs.spec import TrainingSpec

    model = resolve_model(job["model"])
    cluster = resolve_cluster(job["cluster"])
    training = TrainingSpec(**job["training"])
    layout = Layout(**job["layout"])
    part = job.get("partition")
    partition = StagePartition.explicit(part, layout) if part else None
    return estimate(model, training, cluster, int(job["gpus"]), layout, partition, calibration=cal).step_s


def _score(pairs: Sequence[ProfilePair], cal: Calibration, theta: np.ndarray) -> tuple[list[float], str]:
    out: list[float] = []
    methods: set[str] = set()
    for p in pairs:
        if p.job is not None:
            try:
                out.append(reprice_step_s(p.job, cal))
                methods.add("re-priced")
                continue
            except (ValueError, KeyError, TypeError):
                pass
        out.append(float(_predict(np.array([p.columns()]), theta)[0]))
        methods.add("surrogate")
    return out, " + ".join(sorted(methods))


def _source(cluster: str, n: int, theta: np.ndarray, free: np.ndarray) -> str:
    names = ("compute x", "intra bus x", "inter bus x")
    bits = [f"{nm}{1 / math.exp(v):.3g}" for nm, v, f in zip(names, theta[:3], free[:3], strict=True) if f]
    if free[3]:
        bits.append(f"overhead {theta[3] * 1e3:.3g} ms")
    what = ", ".join(bits) if bits else "nothing identified"
    return f"cluster {cluster}: fitted from {n} profile{'s' if n != 1 else ''} ({what} vs global)"


def fit_cluster_calibration(
    cluster: str,
    pairs: Sequence[ProfilePair],
    base: Calibration | None = None,
    *,
    errors: bool = True,
    loo: bool = True,
) -> CalibrationFit:
    """Refit `cluster`'s calibration from its profile pairs (module docstring: method and rules).
    With no pairs, returns `base` (default: the global calibration) unchanged. `errors=False`
    skips the error report (re-pricing every pair, n more fits for leave-one-out): the fit alone."""
    base = base or default_calibration()
    pairs = [p for p in pairs if p.measured_step_s > 0 and p.predicted_step_s > 0]
    n = len(pairs)
    if n == 0:
        factors = _factor_reports(base, base, np.zeros(4, bool), ["no profiles"] * 4)
        return CalibrationFit(cluster, base, 0, factors, {"compute": 1.0, "intra": 1.0, "inter": 1.0},
                              None, None, None, METHOD)
    prob, reasons = _problem(pairs, base)
    theta, robust = _solve_robust(prob)
    outliers = [p.label or f"profile {i}" for i, (p, w) in enumerate(zip(pairs, robust, strict=True)) if w < OUTLIER_WEIGHT]
    cal = _apply(base, theta, _source(cluster, n, theta, prob.free), float(prob.prior[3]))
    mult = {k: float(math.exp(v)) for k, v in zip(("compute", "intra", "inter"), theta[:3], strict=True)}
    nominal = any(((p.job or {}).get("cluster") or {}).get("gpu", {}).get("vendor") == "cpu" for p in pairs)
    implausible = implausible_factors(cal, nominal_peaks=nominal)
    if implausible:
        why = f"{n} profile(s) rejected: " + "; ".join(implausible)
        kept = replace(base, source=f"cluster {cluster}: {why}; global calibration kept")
        factors = _factor_reports(base, kept, np.zeros(4, bool), [why] * 4)
        return CalibrationFit(cluster, kept, n, factors, {"compute": 1.0, "intra": 1.0, "inter": 1.0},
                              None, None, None, METHOD, rejected=why, outliers=outliers)
    factors = _factor_reports(base, cal, prob.free, reasons)
    if not errors:
        return CalibrationFit(cluster, cal, n, factors, mult, None, None, None, METHOD, outliers=outliers)
    measured = [p.measured_step_s for p in pairs]
    before = ErrorStats.of([p.predicted_step_s for p in pairs], measured, "stored prediction (global calibration)")
    pred, how = _score(pairs, cal, theta)
    after = ErrorStats.of(pred, measured, f"in-sample, {how}")
    loo_stats = None
    if loo and n >= 3:
        held: list[float] = []
        hows: set[str] = set()
        for i in range(n):
            rest = pairs[:i] + pairs[i + 1 :]
            sub, _ = _problem(rest, base)
            th, _ = _solve_robust(sub)
            pi, h = _score([pairs[i]], _apply(base, th, "loo", float(sub.prior[3])), th)
            held.append(pi[0])
            hows.add(h)
        loo_stats = ErrorStats.of(held, measured, f"leave-one-out, {' + '.join(sorted(hows))}")
    return CalibrationFit(cluster, cal, n, factors, mult, before, after, loo_stats, METHOD, outliers=outliers)


PLAUSIBLE: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.01, 2.0),
    "fp8_gemm_efficiency": (0.01, 2.0),
    "attention_efficiency": (0.005, 2.0),
    "flash2_attention_efficiency": (0.005, 2.0),
    "hbm_efficiency": (0.01, 2.0),
    "intra_bus_efficiency": (0.01, 1.5),
    "inter_bus_efficiency": (0.01, 1.5),
    "step_overhead_s": (0.0, 30.0),
}
"""Physical ranges of fitted factors. The kernel-rate efficiencies multiply the atlas's measured rates
(`cost_models.calibration`): a cluster twice as fast as the measured GPU's kernels is a wrong
profile, not a faster cluster; bus efficiencies are fractions of the catalog's bus bandwidth, which is itself an
achievable NCCL figure (a cluster may beat it somewhat: 1.5); a fixed cost per step above 30 s is
a stalled run, not an overhead. A fit outside them is refused with the reason (profiles from a
broken or malicious agent cannot move a cluster's prices to 837% MFU)."""


NOMINAL_PEAK_FACTOR = 20.0
"""Efficiency ceiling on devices whose catalog peak is nominal, not a datasheet's (vendor "cpu":
a host's vector units vary by SKU and thread count): 20 x the nominal peak."""


def implausible_factors(cal: Calibration, nominal_peaks: bool = False) -> list[str]:
    """The fitted factors of `cal` outside `PLAUSIBLE`, each with its value and range
    (`nominal_peaks`: the device's peaks are nominal, `NOMINAL_PEAK_FACTOR`)."""
    out = []
    for name, (lo, hi) in PLAUSIBLE.items():
        if nominal_peaks and name.endswith("_efficiency") and "bus" not in name:
            hi = NOMINAL_PEAK_FACTOR
        value = float(getattr(cal, name))
        if not (lo <= value <= hi) or not math.isfinite(value):
            out.append(f"{name} {value:.4g} outside the plausible range {lo:g}-{hi:g}")
    return out


def _factor_reports(base: Calibration, cal: Calibration, free: np.ndarray, reasons: list[str]) -> list[FactorReport]:
    ov = base.overlap("megatron")
    return [
        FactorReport("gemm_efficiency", base.gemm_efficiency, cal.gemm_efficiency, bool(free[0]), reasons[0],
                     "multiplier of the kernel atlas's GEMM rates (attention, fp8 GEMM and HBM multipliers scale with it)"),
        FactorReport("attention_efficiency", base.attention_efficiency, cal.attention_efficiency, bool(free[0]),
                     reasons[0], "multiplier of the kernel atlas's fused attention rates"),
        FactorReport("hbm_efficiency", base.hbm_efficiency, cal.hbm_efficiency, bool(free[0]), reasons[0],
                     "multiplier of the kernel atlas's memory-bound bandwidth"),
        FactorReport("intra_bus_efficiency", base.intra_bus_efficiency, cal.intra_bus_efficiency, bool(free[1]),
                     reasons[1], "fraction of the catalog intra-domain bus bandwidth"),
        FactorReport("inter_bus_efficiency", base.inter_bus_efficiency, cal.inter_bus_efficiency, bool(free[2]),
                     reasons[2], "fraction of the catalog scale-out bus bandwidth"),
        FactorReport("step_overhead_s", base.step_overhead_s, cal.step_overhead_s, bool(free[3]), reasons[3],
                     "seconds per step"),
        FactorReport("overlaps", ov.dp, ov.dp, False,
                     "not identifiable from step totals without raw communication volumes: held at the global "
                     "values (the tier multipliers absorb it)", "fraction hidden (dp shown)"),
    ]
