"""What the estimator keeps between estimates (per workload, per config section) is computed once, never mixes up
two inputs, and never changes an estimate."""

from __future__ import annotations

import gc
import itertools
import json
from dataclasses import replace

import pytest

from tuner.estimator import estimate
from tuner.estimator.memo import _MEMOS
from tuner.estimator.states.trainable import trained_params
from tuner.workload import ClusterSpec, ConfigError, TrainSpec, Workload, ZeroConfig, load_builtin_model


def _workload() -> Workload:
    return Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8, nodes=2), TrainSpec(seq_len=4096))


def test_a_workload_memo_is_computed_once_and_dropped_with_the_workload() -> None:
    work = _workload()
    assert trained_params(work) is trained_params(work)
    assert trained_params(replace(work)) is not trained_params(work)  # another object: its own memo
    key = id(work)
    assert key in _MEMOS
    del work
    gc.collect()
    assert key not in _MEMOS  # the finalizer dropped it


def test_a_zero_section_is_read_once_and_values_of_other_types_are_not_taken_for_it() -> None:
    section = {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 500_000_000}
    first = ZeroConfig.of({"zero_optimization": section})
    assert ZeroConfig.of({"zero_optimization": dict(section)}) is first
    assert ZeroConfig.of({"zero_optimization": {**section, "reduce_bucket_size": 5e8}}).reduce_bucket_size == 5e8
    with pytest.raises(ConfigError, match="overlap_comm"):  # 1 == True in Python, not in DeepSpeed's schema
        ZeroConfig.of({"zero_optimization": {**section, "overlap_comm": 1}})
    with pytest.raises(ConfigError, match="stage"):
        ZeroConfig.of({"zero_optimization": {**section, "stage": True}})


def _configs() -> list[dict]:
    configs = []
    for stage, micro, offload, bucket in itertools.product((0, 1, 2, 3), (1, 4), ("none", "cpu"), (10**7, 5 * 10**8)):
        zero: dict = {"stage": stage, "reduce_bucket_size": bucket, "overlap_comm": bucket > 10**7}
        if stage:
            zero["offload_optimizer"] = {"device": offload}
        configs.append({"train_micro_batch_size_per_gpu": micro, "bf16": {"enabled": True}, "zero_optimization": zero})
    return configs


def test_estimates_do_not_depend_on_what_was_estimated_before() -> None:
    """Each config estimated first on a fresh workload object, then again after every other config: every field
    equal (a cached value a reader changed, or two inputs sharing a cache entry, would show here)."""
    configs = _configs()
    fresh = [json.dumps(estimate(replace(_workload()), config).to_dict(), sort_keys=True) for config in configs]
    work = _workload()
    for config in configs + configs[::-1]:
        estimate(work, config)
    again = [json.dumps(estimate(work, config).to_dict(), sort_keys=True) for config in configs]
    assert again == fresh
