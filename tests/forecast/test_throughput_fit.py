"""Fitting the throughput model's constants: recovery from synthetic runs, the prior, errors, persistence."""

import itertools
import math

import pytest

from tuner.estimator import StepTerms, predict
from tuner.forecast.throughput_fit import (
    FAMILY_PREFIX,
    PredictionAccuracy,
    ThroughputFit,
    fit_factors,
    load_fit,
    prediction_accuracy,
    record_run,
    spearman,
    throughput_summary,
)
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

TRUE = {"compute": 0.4, "launch": 1.6, "bandwidth": 3.0, "latency": 8.0, "memory": 1.2}


def varied_terms() -> list[StepTerms]:
    """Terms of varied configs on one hardware kind, so that every term matters somewhere: a tiny model on one rank
    (compute against per-micro-step costs) and GPT-2 on 2 × 4 ranks (bandwidth), stages 0-3, batch shapes, offload."""
    out = []
    for model, nodes in (("tiny-llama", 1), ("gpt2", 2)):
        ranks = 1 if nodes == 1 else 4
        cluster = ClusterSpec(gpus_per_node=ranks, nodes=nodes, device="cpu")
        work = Workload(load_builtin_model(model), cluster, TrainSpec(seq_len=128))
        for stage, micro, checkpointing in itertools.product((0, 1, 2, 3), (1, 2, 4, 8), (False, True)):
            zero = {"stage": stage, "reduce_bucket_size": 500_000, "allgather_bucket_size": 500_000}
            if stage and micro == 4:
                zero["offload_optimizer"] = {"device": "cpu"}
            ds = {
                "train_batch_size": 16 * ranks * nodes,
                "train_micro_batch_size_per_gpu": micro,
                "bf16": {"enabled": True},
            }
            out.append(predict(work, TrialConfig({**ds, "zero_optimization": zero}, checkpointing)).terms)
    return out


def test_fit_recovers_the_constants_of_runs_the_model_generated() -> None:
    """Every factor whose term is at least 5 % of some run's step time is recovered within 3 %."""
    fit = ThroughputFit()
    runs = varied_terms()
    for terms in runs:
        fit = fit.after_run(terms, terms.step_time(TRUE))
    share = {name: max(getattr(t, name) * value / t.step_time(TRUE) for t in runs) for name, value in TRUE.items()}
    identifiable = [name for name in TRUE if share[name] >= 0.05]
    assert len(identifiable) >= 4, share
    for name in identifiable:
        assert fit.factors[name] == pytest.approx(TRUE[name], rel=0.03), name
    assert fit.in_sample_error() < 0.005
    assert fit.errors[0] > 0.1  # the first run was predicted with the table, far from these constants
    assert statistics_median(fit.errors[-10:]) < 0.01  # later runs were predicted well before they were added


def statistics_median(values: tuple[float, ...]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def test_terms_no_run_exercises_keep_their_prior() -> None:
    runs = [StepTerms(1.0, 0.5, 0, 0, 0), StepTerms(2.0, 0.5, 0, 0, 0), StepTerms(1.0, 2.0, 0, 0, 0)]
    fit = ThroughputFit(prior={"bandwidth": 5.0})
    for terms in runs:
        fit = fit.after_run(terms, terms.step_time({"compute": 2.0, "launch": 0.5}))
    assert fit.factors["bandwidth"] == pytest.approx(5.0) and "latency" not in fit.factors
    assert fit.factors["compute"] == pytest.approx(2.0, rel=0.05)
    assert fit_factors([]) == {} and fit_factors([], {"memory": 2.0}) == {"memory": 2.0}


def test_a_config_measured_again_replaces_its_run_and_nonsense_is_ignored() -> None:
    terms = StepTerms(1.0, 0.1, 0, 0, 0)
    fit = ThroughputFit().after_run(terms, 2.0, key="a").after_run(terms, 3.0, key="a")
    assert len(fit.runs) == 1 and fit.runs[0].measured_s == 3.0
    assert fit.after_run(terms, 0.0) is fit and fit.after_run(terms, math.nan) is fit


def test_stats_round_trip() -> None:
    fit = ThroughputFit(prior={"compute": 2.0}).after_run(StepTerms(1.0, 0.2, 0.1, 0.01, 0.05, 0.5, 0.6), 1.7, "k")
    again = ThroughputFit.from_stats(fit.to_stats())
    assert again == fit
    assert ThroughputFit.from_stats(None) == ThroughputFit()


def test_prediction_accuracy() -> None:
    """Median |predicted / measured - 1| over the runs; the rank correlation only from 3 runs, and not when one side
    does not rank anything."""
    found = prediction_accuracy([90.0, 260.0, 250.0, 500.0], [100.0, 200.0, 300.0, 400.0])
    assert found.runs == 4 and found.median_error == pytest.approx((1 - 250 / 300 + 0.25) / 2)
    assert found.spearman == pytest.approx(0.8)
    two = prediction_accuracy([90.0, 260.0], [100.0, 200.0])
    assert two.median_error == pytest.approx(0.2) and two.spearman is None
    assert prediction_accuracy([5.0, 5.0, 5.0], [1.0, 2.0, 3.0]).spearman is None  # every prediction alike
    assert prediction_accuracy([], []) == PredictionAccuracy(0, None, None)
    with pytest.raises(ValueError, match="one prediction per measured run"):
        prediction_accuracy([1.0], [1.0, 2.0])


def test_spearman() -> None:
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.866, abs=1e-3)  # ties share their mean rank
    with pytest.raises(ValueError):
        spearman([1], [1])


def test_fits_are_kept_per_hardware_and_family_beside_the_memory_margin(tmp_path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        store.put_calibration("cpu", "llama", 0.07, 3, {"ratios": [1.0, 1.01, 1.02], "ooms": 0})
        terms = varied_terms()
        for index, item in enumerate(terms[:6]):
            fit = record_run(store, "cpu", "llama", item, item.step_time(TRUE), key=str(index))
        assert len(fit.runs) == 6 and load_fit(store, "cpu", "llama") == fit and fit.factors
        assert store.get_calibration("cpu", "llama").margin == 0.07  # the memory margin is untouched
        assert store.get_calibration("cpu", FAMILY_PREFIX + "llama").samples == 6
        assert load_fit(store, "cpu", "gpt2") == ThroughputFit()  # another family starts from the table
        assert load_fit(store, "cuda:85899345920", "llama") == ThroughputFit()  # other hardware: nothing known


def test_summary_shown_with_an_estimate_carries_the_fit_and_its_error() -> None:
    work = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=1024))
    ds = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    table = throughput_summary(work, ds)
    assert table["fit_runs"] == 0 and table["error"] is None and not table["fitted"]
    terms = predict(work, ds).terms
    fit = ThroughputFit().after_run(terms, 2 * terms.step_time(), "a").after_run(terms, 2 * terms.step_time(), "a")
    fitted = throughput_summary(work, ds, fit)
    assert fitted["fit_runs"] == 1 and fitted["error"] == pytest.approx(0.5 * (0.5 + fit.errors[1]))
    assert fitted["step_time_s"] == pytest.approx(2 * table["step_time_s"], rel=0.02)
    assert fitted["tokens_per_s"] == pytest.approx(4 * 8 * 1024 / fitted["step_time_s"])
