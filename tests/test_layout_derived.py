"""What derives from the layout registry carries every kind, as the kind says it: the request's field, the API's
considered layouts, the CLI's flag and tune's pin, the recommender's grid or the warm start's savers, a training
command's pins, and each kind's check of a trial through :func:`tuner.workload.check_layout`."""

from __future__ import annotations

import pytest
import typer.main

from tuner.api.considered import ConsideredLayout
from tuner.cli import app
from tuner.cli.options import LONG_CONTEXT_PINS, TUNE_FLAGS
from tuner.cli.script_options import SCRIPT_PINS
from tuner.forecast.warm_start import LONG_CONTEXT
from tuner.recommend import GRID
from tuner.requests import TrialRequest, TrialSettings
from tuner.workload import (
    ClusterSpec,
    ConfigError,
    ParallelLayout,
    TrialConfig,
    Workload,
    check_layout,
    load_builtin_model,
)
from tuner.workload.layouts import LAYOUTS, PLAINEST_FIRST, LayoutKind

KINDS = pytest.mark.parametrize("kind", LAYOUTS, ids=[kind.label for kind in LAYOUTS])


@KINDS
def test_the_request_field_is_the_kinds(kind: LayoutKind) -> None:
    field = TrialSettings.model_fields[kind.field]
    bounds = {type(item).__name__: item for item in field.metadata}
    assert (field.default, field.description) == (1, kind.description)
    assert (bounds["Ge"].ge, bounds["Le"].le) == (1, kind.maximum)
    trial = TrialRequest(**{kind.field: 2}).to_trial("bf16")
    assert trial.layout.degree(kind) == 2 and TrialRequest().to_trial("bf16").layout.degree(kind) == 1


@KINDS
def test_the_considered_layout_and_the_grids_carry_it(kind: LayoutKind) -> None:
    considered = ConsideredLayout.model_fields[kind.field]
    assert considered.description == f"{kind.noun} ({kind.key}); 1: off."
    assert [name for name in ConsideredLayout.model_fields if name in {k.field for k in LAYOUTS}] == [
        k.field for k in PLAINEST_FIRST
    ]
    assert (kind.field in LONG_CONTEXT, kind.field in GRID) == (kind.memory_saver, not kind.memory_saver)
    assert (SCRIPT_PINS.get(kind.field) == 1) == kind.trainer_applied


@KINDS
def test_each_command_takes_its_flag_and_tune_pins_it(kind: LayoutKind) -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("estimate", "measure", "tune"):
        options = {opt: param for param in commands[name].params for opt in param.opts}
        assert options[kind.flag].help == kind.help, name
    assert kind.parameter in TUNE_FLAGS and LONG_CONTEXT_PINS[kind.parameter] == kind.field


def test_check_layout_runs_each_kinds_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind but Ulysses (checked by check_long_context first) is asked, AutoTP, hpZ, AutoEP in that order."""
    asked: list[str] = []
    for kind in LAYOUTS:
        monkeypatch.setattr(type(kind), "check", lambda self, workload, trial: asked.append(self.label))
    check_layout(Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2)), TrialConfig({}))
    assert asked == ["TP", "hpZ", "EP"]


def test_the_layout_reads_hpz_from_the_zero_section_and_knows_the_off_sections() -> None:
    zero = {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}}
    assert ParallelLayout.of(zero).label() == "hpZ 2" and ParallelLayout.of(zero, zero=False).label() == ""
    with pytest.raises(ConfigError, match="zero_hpz_partition_size"):
        TrialConfig({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": "two"}}).zero  # noqa: B018
    off = {"tensor_parallel": {"autotp_size": 1}, "expert_parallel": {"autoep_size": 1}, "sequence_parallel_size": 1}
    assert ParallelLayout.without_off({**off, "train_batch_size": 8}) == {"train_batch_size": 8}
    on = {"tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2}
    assert ParallelLayout.without_off(on) == on
