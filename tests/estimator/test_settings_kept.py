"""resolve reads and checks each trial apart from its batch keys once per workload
(:func:`tuner.estimator.settings._kept`): configs that differ only in their batch keys resolve to the settings a
fresh, uncached read gives, a bad batch is refused as before, and the rest of the trial is not read again."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tuner.estimator import Settings, estimate, resolve
from tuner.estimator import settings as settings_module
from tuner.workload import ClusterSpec, ConfigError, TrialConfig, Workload, load_builtin_model

SECTIONS = (
    {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
    {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "sequence_parallel_size": 2},
    {"zero_optimization": {"stage": 1, "overlap_comm": True}, "dstune": {"tiled_mlp_shards": 2}},
)
BATCHES = (
    {"train_micro_batch_size_per_gpu": 2},
    {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
    {"train_batch_size": 16, "gradient_accumulation_steps": 1},
    {},
)


def _workload() -> Workload:
    return Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=4))


def _fresh(work: Workload, trial: TrialConfig) -> Settings:
    """The settings read from the whole trial, nothing kept."""
    return settings_module._resolved(work, trial)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_kept_settings_equal_a_fresh_read(checkpointing: bool) -> None:
    work = _workload()
    for section, batch in itertools.product(SECTIONS, BATCHES):
        trial = TrialConfig({**batch, **section}, checkpointing)
        for _ in range(2):  # the second resolves from what the first kept
            settings = resolve(work, trial)
            fresh = _fresh(work, trial)
            assert settings == fresh and vars(settings) == vars(fresh)
            assert list(vars(settings)) == [field.name for field in dataclasses.fields(Settings)]
        assert estimate(work, trial).to_dict() == estimate(work, trial).to_dict()


def test_checkpointing_is_part_of_the_key() -> None:
    work = _workload()
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    assert not resolve(work, config).activation_checkpointing
    assert resolve(work, TrialConfig(config, True)).activation_checkpointing


def test_the_rest_of_a_trial_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = []
    real = settings_module._check
    monkeypatch.setattr(settings_module, "_check", lambda *args: checks.append(args) or real(*args))
    work = _workload()
    for micro in (1, 2, 4, 8):
        resolve(work, {"train_micro_batch_size_per_gpu": micro, "zero_optimization": {"stage": 2}})
    assert len(checks) == 1
    resolve(work, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    assert len(checks) == 2
    resolve(_workload(), {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}})
    assert len(checks) == 3  # another workload: its own checks


def test_a_bad_batch_is_refused_after_a_good_one() -> None:
    work = _workload()
    resolve(work, {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}})
    bad = {"train_micro_batch_size_per_gpu": 2, "train_batch_size": 7, "zero_optimization": {"stage": 2}}
    with pytest.raises(ConfigError) as kept:
        resolve(work, bad)
    with pytest.raises(ConfigError) as fresh:
        _fresh(work, TrialConfig(bad))
    assert (kept.value.field, str(kept.value)) == (fresh.value.field, str(fresh.value))


def test_a_refused_trial_is_not_kept() -> None:
    work = _workload()
    bad = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "overlap_comm": "yes"}}
    for _ in range(2):
        with pytest.raises(ConfigError, match="overlap_comm"):
            resolve(work, bad)


def test_the_kept_trials_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "MAX_KEPT", 4)
    work = _workload()
    for bucket in range(10):
        resolve(work, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 2 * (bucket + 1)}})
        assert len(settings_module._kept(work)) <= 4
