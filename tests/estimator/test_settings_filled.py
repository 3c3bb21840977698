"""resolve fills a Settings' instance dict at once (:func:`tuner.estimator.settings._filled`): the result must be the
Settings its own constructor makes from the same values, every field set, and a missing value must be refused."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.estimator import Settings, resolve
from tuner.estimator.settings import _filled
from tuner.workload import ClusterSpec, Workload, load_builtin_model

CONFIGS = (
    {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
    {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "sequence_parallel_size": 2},
)


@pytest.mark.parametrize("config", CONFIGS)
def test_resolved_settings_are_the_constructors(config: dict) -> None:
    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=4))
    settings = resolve(work, config)
    values = {field.name: getattr(settings, field.name) for field in dataclasses.fields(Settings)}
    assert vars(settings) == values
    built = Settings(**values)
    assert settings == built and hash(settings) == hash(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.stage = 1  # type: ignore[misc]


def test_a_missing_value_is_refused() -> None:
    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2))
    values = dict(vars(resolve(work, {})))
    del values["stage"]
    with pytest.raises(TypeError, match="Settings takes"):
        _filled(values)
