"""The throughput model's constants, fitted per hardware kind from the study's own measured runs (pure Python).

:func:`tuner.estimator.predict` predicts a step as five terms (compute, launch, bandwidth, latency, memory) at
the hardware table's rates. A :class:`ThroughputFit` holds one multiplicative factor per term and the runs behind
them; after each measured run the factors are refitted by damped Gauss-Newton (Levenberg-Marquardt) on the log of
predicted over measured step time, with a ridge pull of ``log factor`` towards 0 (the table) so that a term no run
exercises stays at the table's value. Errors are kept two ways: ``errors`` are the honest ones, each run predicted
*before* it joined the fit; :meth:`ThroughputFit.in_sample_error` is the residual of the fit itself.

Persisted like the memory margin in ``dstune_calibration`` (no table of its own), in the row (hardware,
``throughput:<family>``): its ``stats`` JSON holds ``factors``, ``prior``, ``runs`` and ``errors``; its ``margin``
column is unused (0).

Example:
    >>> from tuner.estimator import StepTerms
    >>> fit = ThroughputFit()
    >>> for terms in (StepTerms(1.0, 1.0, 0, 0, 0), StepTerms(0.5, 2.0, 0, 0, 0), StepTerms(2.0, 0.5, 0, 0, 0)):
    ...     fit = fit.after_run(terms, terms.step_time({"compute": 3.0, "launch": 0.5}))
    >>> round(fit.factors["compute"], 1), round(fit.factors["launch"], 1)
    (3.0, 0.5)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.estimator import TERMS, StepTerms, predict
from tuner.workload import TrialConfig, Workload

MAX_RUNS = 200  # the most recent runs kept per row
RIDGE = 0.003  # pull of each log factor towards its prior: noise (~0.15² in log) over a prior spread (~e^±3)
LOG_BOUND = 7.0  # factors stay within e^±7 (about 1100×) of the table
ITERATIONS = 40
FAMILY_PREFIX = "throughput:"


@dataclass(frozen=True)
class Run:
    """One measured run: its terms at the table's rates and the measured seconds per optimizer step."""

    terms: StepTerms
    measured_s: float
    key: str | None = None


@dataclass(frozen=True)
class ThroughputFit:
    """Fitted factors (by term name; 1 = the table) and the runs they come from."""

    factors: dict[str, float] = field(default_factory=dict)
    runs: tuple[Run, ...] = ()
    prior: dict[str, float] = field(default_factory=dict)  # what the ridge pulls towards (empty: the table)
    errors: tuple[float, ...] = ()  # |predicted / measured - 1| of each run, predicted before it was added

    def predict_s(self, terms: StepTerms) -> float:
        """Seconds per optimizer step with the fitted factors."""
        return terms.step_time(self.factors)

    def after_run(self, terms: StepTerms, measured_s: float, key: str | None = None) -> ThroughputFit:
        """The fit once a run measured ``measured_s`` seconds per step (a run of the same ``key`` is replaced)."""
        if not (measured_s > 0 and math.isfinite(measured_s)):
            return self
        error = abs(self.predict_s(terms) / measured_s - 1)
        kept = tuple(run for run in self.runs if key is None or run.key != key)
        runs = (*kept, Run(terms, measured_s, key))[-MAX_RUNS:]
        factors = fit_factors(runs, self.prior)
        return ThroughputFit(factors, runs, self.prior, (*self.errors, error)[-MAX_RUNS:])

    def starting_from(self) -> ThroughputFit:
        """A fit with no runs that predicts, and is pulled towards, this fit's factors (a warm start)."""
        return ThroughputFit(dict(self.factors), (), dict(self.factors))

    def in_sample_error(self) -> float | None:
        """Median |predicted / measured - 1| over the runs with the fitted factors (None without runs)."""
        if not self.runs:
            return None
        return statistics.median(abs(self.predict_s(run.terms) / run.measured_s - 1) for run in self.runs)

    def median_error(self) -> float | None:
        """Median out-of-sample error (each run predicted before it joined the fit), or None."""
        return statistics.median(self.errors) if self.errors else None

    def to_stats(self) -> dict[str, Any]:
        """The ``stats`` JSON of its calibration row."""
        return {
            "factors": dict(self.factors),
            "prior": dict(self.prior),
            "runs": [{"terms": r.terms.to_dict(), "measured_s": r.measured_s, "key": r.key} for r in self.runs],
            "errors": list(self.errors),
        }

    @classmethod
    def from_stats(cls, stats: dict[str, Any] | None) -> ThroughputFit:
        """The inverse of :meth:`to_stats` (an empty fit for None)."""
        if not stats:
            return cls()
        runs = tuple(
            Run(StepTerms.from_dict(r["terms"]), float(r["measured_s"]), r.get("key")) for r in stats.get("runs", ())
        )
        factors = {str(k): float(v) for k, v in (stats.get("factors") or {}).items()}
        prior = {str(k): float(v) for k, v in (stats.get("prior") or {}).items()}
        return cls(factors, runs, prior, tuple(float(e) for e in stats.get("errors", ())))


def fit_factors(
    runs: Sequence[Run], prior: Mapping[str, float] | None = None, ridge: float = RIDGE
) -> dict[str, float]:
    """Factors minimising Σ log²(predicted / measured) + ridge · Σ log²(factor / prior) (Levenberg-Marquardt).

    A term no run exercises keeps its prior (1 without one)."""
    start = [math.log((prior or {}).get(name, 1.0)) for name in TERMS]
    if not runs:
        return {name: math.exp(start[i]) for i, name in enumerate(TERMS) if start[i]}
    active = [i for i, name in enumerate(TERMS) if any(run.terms.values()[i] > 0 for run in runs)]
    phi = list(start)

    def residuals(point: list[float]) -> list[float]:
        factors = {name: math.exp(value) for name, value in zip(TERMS, point, strict=True)}
        out = [math.log(max(run.terms.step_time(factors), 1e-300) / run.measured_s) for run in runs]
        return out + [math.sqrt(ridge) * (point[i] - start[i]) for i in active]

    def cost(point: list[float]) -> float:
        return sum(r * r for r in residuals(point))

    damping, current = 1e-3, cost(phi)
    for _ in range(ITERATIONS):
        base = residuals(phi)
        jacobian = []  # one column per active factor, by forward differences
        for i in active:
            moved = list(phi)
            moved[i] += 1e-6
            jacobian.append([(a - b) / 1e-6 for a, b in zip(residuals(moved), base, strict=True)])
        normal = [[sum(a * b for a, b in zip(ci, cj, strict=True)) for cj in jacobian] for ci in jacobian]
        gradient = [sum(a * b for a, b in zip(ci, base, strict=True)) for ci in jacobian]
        improved = False
        while damping < 1e8:
            system = [
                [normal[r][c] + (damping * (1 + normal[r][r]) if r == c else 0.0) for c in range(len(active))]
                for r in range(len(active))
            ]
            step = _solve(system, [-g for g in gradient])
            trial = list(phi)
            for i, delta in zip(active, step, strict=True):
                trial[i] = min(LOG_BOUND, max(-LOG_BOUND, trial[i] + delta))
            trial_cost = cost(trial)
            if trial_cost < current:
                phi, current, damping, improved = trial, trial_cost, max(1e-9, damping / 10), True
                break
            damping *= 10
        if not improved or max((abs(s) for s in step), default=0.0) < 1e-7:
            break
    return {name: math.exp(phi[i]) for i, name in enumerate(TERMS) if i in active or start[i]}


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Solve a small dense linear system by Gaussian elimination with partial pivoting."""
    n = len(vector)
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        if abs(rows[col][col]) < 1e-300:
            continue
        for r in range(col + 1, n):
            ratio = rows[r][col] / rows[col][col]
            for c in range(col, n + 1):
                rows[r][c] -= ratio * rows[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        if abs(rows[r][r]) < 1e-300:
            continue
        out[r] = (rows[r][n] - sum(rows[r][c] * out[c] for c in range(r + 1, n))) / rows[r][r]
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank).

    Example:
        >>> spearman([1, 2, 3, 4], [10, 20, 40, 30])
        0.8
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("spearman needs two sequences of equal length, at least 2")
    return statistics.correlation(_ranks(xs), _ranks(ys))


@dataclass(frozen=True)
class PredictionAccuracy:
    """How predicted tokens/s matched measured over some runs.

    ``median_error``: the median of ``|predicted / measured - 1|`` (a fraction; None without runs). ``spearman``: the
    rank correlation of predicted and measured (None below :data:`MIN_RANKED` runs or when either side is constant).
    """

    runs: int
    median_error: float | None
    spearman: float | None


MIN_RANKED = 3  # fewer runs than this have no meaningful rank correlation


def prediction_accuracy(predicted: Sequence[float], measured: Sequence[float]) -> PredictionAccuracy:
    """The accuracy of predicted tokens/s against measured, run by run (measured > 0).

    The error is on tokens/s, the figure people compare; :attr:`ThroughputFit.errors` are on step time.

    Example:
        >>> prediction_accuracy([125.0, 150.0, 375.0], [100.0, 200.0, 300.0])
        PredictionAccuracy(runs=3, median_error=0.25, spearman=1.0)
        >>> prediction_accuracy([110.0], [100.0]).spearman is None
        True
    """
    if len(predicted) != len(measured):
        raise ValueError("prediction_accuracy needs one prediction per measured run")
    errors = [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
    rho = None
    if len(errors) >= MIN_RANKED:
        try:
            rho = spearman(predicted, measured)
        except statistics.StatisticsError:  # every prediction (or every measurement) alike: no ranking to compare
            rho = None
    return PredictionAccuracy(len(errors), statistics.median(errors) if errors else None, rho)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2
        start = end + 1
    return ranks


def throughput_summary(
    workload: Workload, trial: TrialConfig | Mapping[str, Any], fit: ThroughputFit | None = None
) -> dict:
    """The ``throughput`` object shown with an estimate (``dstune estimate --json``, ``/v1/estimate``): the prediction
    with the fit's factors, plus ``fit_runs`` (measured runs behind them; 0: the hardware table) and ``error`` (their
    median out-of-sample relative error of step time; null before any run).

    Example:
        >>> from tuner.workload import ClusterSpec, Workload, load_builtin_model
        >>> out = throughput_summary(Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=8)),
        ...                          {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}})
        >>> out["bound"], out["fit_runs"], out["error"]
        ('compute', 0, None)
    """
    fit = fit or ThroughputFit()
    return predict(workload, trial, fit.factors).to_dict(len(fit.runs), fit.median_error())


# ------------------------------------------------------------------------------------------------ persistence


def load_fit(store: Any, hardware: str, family: str) -> ThroughputFit:
    """The stored fit for (hardware, family), or an empty fit (the hardware table).

    Fits are not shared across model families: on the bench's CPU landscapes, constants fitted on one family and
    world size ranked the other's configs worse than the table did (``bench/results/search_efficiency.md``)."""
    found = store.get_calibration(hardware, FAMILY_PREFIX + family)
    return ThroughputFit.from_stats(found.stats if found is not None else None)


def record_run(
    store: Any, hardware: str, family: str, terms: StepTerms, measured_s: float, key: str | None = None
) -> ThroughputFit:
    """Add one measured run to the (hardware, family) fit, refit, store it; returns the new fit.

    ``terms``: :func:`tuner.estimator.throughput.prediction.predict`'s ``terms`` for the run's workload and ds_config;
    ``measured_s``: the measured seconds per optimizer step (the median step).
    """
    fit = load_fit(store, hardware, family).after_run(terms, measured_s, key)
    store.put_calibration(hardware, FAMILY_PREFIX + family, 0.0, len(fit.runs), fit.to_stats())
    return fit


__all__ = [
    "MIN_RANKED",
    "PredictionAccuracy",
    "Run",
    "ThroughputFit",
    "fit_factors",
    "load_fit",
    "prediction_accuracy",
    "record_run",
    "spearman",
    "throughput_summary",
]
