"""The memory boundary learned from the runs (tuner.study.memory_bound): which configs need at least as much memory
as one that ran out of it, and the loop pruning them in a training command's study (the real TuningStudy on a real
SQLite store, its runs scripted by the loop tests' fake measurer)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.study.test_loop_logic import FakeMeasurer, settings, shape
from tuner.measure.measurement import Measurement
from tuner.measure.options import MeasureOptions
from tuner.measure.script.command import ScriptCommand
from tuner.storage import Store
from tuner.study import TuningStudy
from tuner.study.memory_bound import OutOfMemory, heavier, pruned_by_oom
from tuner.workload import TrialConfig


def config(stage: int = 1, micro: int = 4, accum: int = 1, offload: str = "none", **zero: Any) -> TrialConfig:
    section = {"stage": stage, "offload_optimizer": {"device": offload}, **zero}
    return TrialConfig(
        {"zero_optimization": section, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum}
    )


@pytest.mark.parametrize(
    ("candidate", "device", "needs_as_much"),
    [
        (config(micro=8), "cpu", True),  # a larger micro-batch
        (config(stage=0, micro=4), "cpu", True),  # a lower stage partitions less
        (config(stage=0, micro=8), "cuda", True),
        (config(micro=2), "cpu", False),  # a smaller micro-batch may fit
        (config(stage=2, micro=8), "cpu", False),  # heavier on one knob, lighter on another
        (config(micro=8, accum=2), "cpu", False),  # accumulation differs: not comparable
        (config(micro=4, offload="none", reduce_bucket_size=10**9), "cpu", None),  # another key set
        (TrialConfig(config(micro=8).ds_config, activation_checkpointing=True), "cpu", False),
    ],
)
def test_which_configs_need_at_least_as_much_memory(candidate: TrialConfig, device: str, needs_as_much: Any) -> None:
    failed = config(micro=4)
    assert bool(heavier(candidate, failed, device)) is bool(needs_as_much)


def test_offload_counts_on_gpus_only() -> None:
    """Less offload needs more GPU memory; CPU ranks hold both sides in one memory, so there it says nothing."""
    failed = config(micro=4, offload="cpu")
    assert heavier(config(micro=4, offload="none"), failed, "cuda") == [("optimizer offload", "none", "cpu")]
    assert heavier(config(micro=4, offload="none"), failed, "cpu") is None
    assert heavier(config(micro=4, offload="cpu"), config(micro=4, offload="none"), "cuda") is None


def test_the_reason_names_the_failed_trial_and_what_this_config_needs_more_of() -> None:
    failures = [OutOfMemory(1, config(micro=16)), OutOfMemory(3, config(stage=1, micro=8))]
    reason = pruned_by_oom(config(stage=0, micro=8), failures, "cpu")
    assert reason == "ZeRO stage 1 ran out of memory at trial 3; this config needs at least as much: ZeRO stage 0"
    assert pruned_by_oom(config(micro=2), failures, "cpu") is None


BOUND = re.compile(r"micro-batch (\d+) ran out of memory at trial (\d+); this config needs at least as much")


def oom_from_micro_2(ds_config: dict[str, Any]) -> Measurement:
    micro = shape(ds_config)[1]
    if micro >= 2:
        return Measurement(status="oom", exception_type="OutOfMemoryError", error="out of memory")
    return Measurement(status="ok", tokens_per_s=1000.0 * micro, peak_bytes_per_rank=[2**20])


def _study(tmp_path: Path, store: Store, script: ScriptCommand | None) -> tuple[FakeMeasurer, list[Any]]:
    base = settings(tmp_path, stages=[0], micros=[1, 2, 4, 8], trials=4)
    study = TuningStudy(replace(base, global_batch=None, dispatch=MeasureOptions(script=script)), store)
    measurer = FakeMeasurer(oom_from_micro_2)
    study.run(measurer)
    return measurer, store.trials(study.study_id)


def test_a_command_study_prunes_what_needs_as_much_as_a_config_that_ran_out(tmp_path: Path) -> None:
    """Micro-batches 2 and up run out of memory: once one has, the larger ones are pruned with the reason, never
    run; dstune's own trainer's study keeps measuring them (its estimator decides, as before)."""
    script = ScriptCommand(("python", "train.py"), str(tmp_path))
    with Store.open(f"sqlite:///{tmp_path / 'command.db'}") as store:
        measurer, trials = _study(tmp_path, store, script)
        ooms = {t.trial.batch[0]: t.number for t in trials if t.status == "oom"}
        bounded = [t for t in trials if t.status == "pruned" and BOUND.match(t.prune_reason or "")]
        assert bounded and len(measurer.submitted) < len(trials)
        for trial in bounded:
            micro, number = map(int, BOUND.match(trial.prune_reason or "").groups())  # type: ignore[union-attr]
            assert ooms[micro] == number < trial.number and trial.trial.batch[0] > micro
        assert all(shape(config)[1] not in {t.trial.batch[0] for t in bounded} for config in measurer.submitted)
    with Store.open(f"sqlite:///{tmp_path / 'builtin.db'}") as store:
        tmp_builtin = tmp_path / "builtin"
        tmp_builtin.mkdir()
        measurer, trials = _study(tmp_builtin, store, None)
        assert not [t for t in trials if BOUND.match(t.prune_reason or "")]
        assert len(measurer.submitted) == len(trials)
