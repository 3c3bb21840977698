"""The recommender's reads (``Store.best_measured_trial``, ``Store.nearest_measured_trials``), on every backend."""

from __future__ import annotations

from tuner.storage import MeasuredTrial, Store
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model, model_from_param_count

DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}
ESTIMATE = {"per_gpu": {"total": 1234}}


def workload(gpus: int = 2, seq_len: int = 512, model: str = "gpt2") -> Workload:
    return Workload(load_builtin_model(model), ClusterSpec(gpus_per_node=gpus), TrainSpec(seq_len=seq_len))


def study(store: Store, name: str, of: Workload) -> int:
    return store.get_or_create_study(name, store.upsert_workload(of), "tpe", {}).id


def trial(store: Store, study_id: int, key: str, tokens: float | None, status: str = "ok") -> int:
    trial_id = store.add_trial(study_id, 0, key, {**DS_CONFIG, "key": key}, None, key.endswith("ckpt"), ESTIMATE)
    store.start_trial(trial_id)
    store.finish_trial(trial_id, status, {"tokens_per_s": tokens, "peak_bytes_per_rank": [5, 8]})
    return trial_id


def test_best_measured_trial_is_the_fastest_ok_trial_over_every_study_of_the_workload(store: Store) -> None:
    target = workload()
    assert store.best_measured_trial(target.fingerprint()) is None  # no such workload
    first = study(store, "first", target)
    trial(store, first, "unmeasured", None)
    trial(store, first, "oom", 9_000.0, status="oom")
    assert store.best_measured_trial(target.fingerprint()) is None  # nothing ok with a throughput
    trial(store, first, "slow", 100.0)
    second = study(store, "second", target)
    fastest = trial(store, second, "fast-ckpt", 300.0)
    trial(store, first, "tie", 300.0)  # later id: loses the tie
    trial(store, study(store, "elsewhere", workload(gpus=4)), "other", 10_000.0)
    best = store.best_measured_trial(target.fingerprint())
    assert best == MeasuredTrial(
        trial_id=fastest,
        study="second",
        workload_fingerprint=target.fingerprint(),
        ds_config={**DS_CONFIG, "key": "fast-ckpt"},
        activation_checkpointing=True,
        tokens_per_s=300.0,
        peak_bytes=8,
        estimated_peak_bytes=1234,
        number=0,
    )


def test_nearest_measured_trials_of_the_same_model_on_other_workloads(store: Store) -> None:
    target = workload()
    trial(store, study(store, "self", target), "own", 99_999.0)  # the workload itself is left out
    trial(store, study(store, "bigger-model", workload(model="gpt2-medium")), "m", 50_000.0)
    trial(store, study(store, "bare", Workload(model_from_param_count(1e9))), "b", 60_000.0)
    four = workload(gpus=4)
    four_study = study(store, "four", four)
    four_ids = [trial(store, four_study, f"k{n}", float(n)) for n in range(5)]
    trial(store, four_study, "failed", 70_000.0, status="error")
    long = workload(seq_len=1024)
    long_id = trial(store, study(store, "long", long), "l", 2.5)
    found = store.nearest_measured_trials(
        "gpt2", target.model.n_params, target.fingerprint(), workloads=10, per_workload=3
    )
    assert [(m.trial_id, m.study, m.workload_fingerprint) for m in found] == [
        (four_ids[4], "four", four.fingerprint()),
        (four_ids[3], "four", four.fingerprint()),
        (long_id, "long", long.fingerprint()),
        (four_ids[2], "four", four.fingerprint()),
    ]
    assert found[0].ds_config == {**DS_CONFIG, "key": "k4"} and found[0].peak_bytes == 8
    newest_only = store.nearest_measured_trials(
        "gpt2", target.model.n_params, target.fingerprint(), workloads=1, per_workload=1
    )
    assert [m.trial_id for m in newest_only] == [long_id]  # the newest other workload
    assert store.nearest_measured_trials("llama", 7, target.fingerprint(), workloads=10, per_workload=3) == []
