"""``expandable_segments``: a search-space parameter under dstune's own ds_config section, read by the estimator
(CUDA allocator reserve), turned into ``PYTORCH_CUDA_ALLOC_CONF`` for CUDA runs, pinned off for CPU studies."""

import optuna
import pytest

from tuner.estimator import ConfigError, estimate, resolve
from tuner.measure.rank.alloc_conf import alloc_conf
from tuner.space import default_space_path, load_space
from tuner.workload import ClusterSpec, TrialConfig, Workload, load_builtin_model


def test_the_default_space_searches_it_and_writes_it_only_when_on() -> None:
    space = load_space(default_space_path())
    assert "expandable_segments" in space.searched
    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2))
    space = space.restricted(["stage", "expandable_segments"])
    on = space.suggest(optuna.trial.FixedTrial({"stage": 2, "expandable_segments": True}), work)
    off = space.suggest(optuna.trial.FixedTrial({"stage": 2, "expandable_segments": None}), work)
    assert on.trial.ds_config["dstune"] == {"expandable_segments": True} and "dstune" not in off.trial.ds_config
    assert resolve(work, on.trial).expandable_segments and not resolve(work, off.trial).expandable_segments
    big = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=2))
    assert estimate(big, on.trial).gpu_total < estimate(big, off.trial).gpu_total  # less allocator reserve


def test_a_bad_value_names_its_key() -> None:
    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=1))
    with pytest.raises(ConfigError, match=r"dstune\.expandable_segments"):
        resolve(work, {"dstune": {"expandable_segments": "yes"}})


def test_the_run_gets_the_environment_and_deepspeed_the_rest() -> None:
    config = {"train_micro_batch_size_per_gpu": 1, "dstune": {"expandable_segments": True}}
    assert alloc_conf(config, None) == "expandable_segments:True"
    assert alloc_conf(config, "expandable_segments:False,max_split_size_mb:64") == (
        "max_split_size_mb:64,expandable_segments:True"
    )
    assert alloc_conf({"train_micro_batch_size_per_gpu": 1}, "x:1") is None
    assert TrialConfig(config).deepspeed_config() == {"train_micro_batch_size_per_gpu": 1}
