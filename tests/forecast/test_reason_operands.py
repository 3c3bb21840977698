"""A pruned trial's kind keeps what its reason tested: a condition's operands and the config's values stay as
written, only what was measured (sizes, percentages, the trial named) becomes ``N``. The kinds of a pinned value's
condition read ``stage >= 1 (stage = 0)``, not ``stage >= N (stage = N)`` (with every operand ``N`` a pin's reason
read ``pinned to N but applies only when gpus_per_node >= N and trainable_params >= N ...``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from tuner.forecast import group_counts, group_reasons, reason_key
from tuner.space import InfeasibleConfig, default_space_path, load_space
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

optuna.logging.set_verbosity(optuna.logging.WARNING)


def pinned_reason() -> str:
    """The reason the default space gives a stage-0 trial of a study pinning round_robin_gradients (it pins CPU
    optimizer offload, which applies from ZeRO-1 on)."""
    work = Workload(
        replace(load_builtin_model("tiny-llama"), implementation="transformers"),
        ClusterSpec(gpus_per_node=2, gpu_memory=2**30, device="cpu"),
        TrainSpec(seq_len=64),
    )
    space = load_space(default_space_path(), pins={"round_robin_gradients": True, "stage": 0})
    with pytest.raises(InfeasibleConfig) as pruned:
        space.suggest(optuna.create_study().ask(), work, global_batch=8)
    return pruned.value.reason


def test_a_pins_condition_keeps_its_operands_in_its_kind(tmp_path: Path) -> None:
    reason = pinned_reason()
    assert reason == "offload_optimizer is pinned to 'cpu', which applies only when stage >= 1 (stage = 0)"
    assert reason_key(reason) == reason
    assert [group.key for group in group_reasons([reason, reason])] == [reason]
    with Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}") as store:  # the store's histogram (API, dashboard)
        work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(64))
        study = store.get_or_create_study("s", store.upsert_workload(work), "tpe", {})
        store.add_infeasible(study.id, 0, {"stage": 0}, reason)
        summary = store.study_summary(study.id)
    assert summary.pruned_reasons == {reason: 1} and group_counts(summary.pruned_reasons) == {reason: 1}


def test_what_a_reason_measured_still_groups() -> None:
    memory = [
        "needs 1.97 GiB of 64.0 MiB GPU memory at the backward phase (5% margin included); largest: buffers 1.00 GiB",
        "needs 2.50 GiB of 64.0 MiB GPU memory at the backward phase (5% margin included); largest: buffers 1.20 GiB",
    ]
    assert [(g.key, g.count) for g in group_reasons(memory)] == [("GPU memory · backward · buffers", 2)]
    oom = [
        f"micro-batch 8 ran out of memory at trial {n}; this config needs at least as much: micro-batch 16"
        for n in (3, 5)
    ]
    assert [(g.key, g.count) for g in group_reasons(oom)] == [
        ("micro-batch 8 ran out of memory at trial N; this config needs at least as much: micro-batch 16", 2)
    ]
