"""The recommender's estimate source: the feasible config with the best predicted throughput, saying so."""

from pathlib import Path

from tuner.estimator.throughput import StepTerms
from tuner.forecast import FAMILY_PREFIX, Calibration, ThroughputFit, rank_feasible
from tuner.recommend import PREDICTION_TIE, _grid_space, recommend
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

LLAMA = Workload(
    load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8, gpu_memory=80 * 2**30), TrainSpec(seq_len=4096)
)


def test_nothing_measured_answers_the_best_predicted_feasible_config(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        answer = recommend(store, LLAMA)
    assert answer.source == "estimate" and answer.tokens_per_s is None
    assert answer.prediction is not None and answer.prediction["fit_runs"] == 0 and not answer.prediction["fitted"]
    ranked = rank_feasible(_grid_space(), LLAMA, Calibration())
    best = ranked[0].prediction.tokens_per_s
    assert answer.predicted_tokens_per_s >= (1 - PREDICTION_TIE) * best
    assert any(r.suggestion.trial.ds_config == answer.trial.ds_config for r in ranked)


def test_fitted_constants_of_the_hardware_and_family_move_the_answer(tmp_path: Path) -> None:
    """Runs on this hardware said collectives and hooks cost 10,000× the table: ZeRO-3 (a fetch per parameter and
    pass) drops out of the answer."""
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        table = recommend(store, LLAMA)
        fit = ThroughputFit()
        for latency in (1.0, 2.0, 4.0):
            fit = fit.after_run(StepTerms(1.0, 0.0, 0.0, latency, 0.0), 1.0 + 10_000 * latency)
        store.put_calibration(f"cuda:{80 * 2**30}", FAMILY_PREFIX + "llama", 0.0, len(fit.runs), fit.to_stats())
        fitted = recommend(store, LLAMA)
    assert table.trial.ds_config["zero_optimization"]["stage"] == 3  # 7B on 8 × 80 GB: only ZeRO-3 fits a large batch
    assert fitted.prediction["fitted"] and fitted.prediction["fit_runs"] == 3
    assert fitted.prediction["factors"]["latency"] > 1000
    assert fitted.trial.ds_config != table.trial.ds_config
