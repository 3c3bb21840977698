"""``--warmup-max`` on ``dstune tune`` and ``dstune measure``: checked like every flag (one line naming it, exit 2)
and handed to the measured runs (in process: the study and the run are replaced by recorders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

runner = CliRunner()
TINY = ["--model", "tiny-gpt2", "--seq-len", "64", "--device", "cpu"]


class Built(Exception):
    """Raised by the recording study: the settings it was built with, and no run."""


@pytest.mark.parametrize("command", ["tune", "measure"])
@pytest.mark.parametrize(
    "args",
    [["--warmup-max", "0"], ["--warmup-max", "-3"], ["--warmup-max", "many"], ["--warmup", "4", "--warmup-max", "3"]],
)
def test_bad_warmup_max_exits_2_naming_the_flag(command: str, args: list[str]) -> None:
    result = runner.invoke(app, [command, *TINY, *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: warmup-max: ") and "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "expected"), [([], None), (["--warmup-max", "6"], 6), (["--warmup-max", "2"], 2)])
def test_tune_hands_warmup_max_to_the_measured_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: int | None
) -> None:
    def recording_study(settings: Any, store: Any) -> None:
        raise Built(settings)

    monkeypatch.setattr("tuner.study.TuningStudy", recording_study)
    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    result = runner.invoke(app, ["tune", *TINY, "--launcher", "local", "--storage", storage, *args])
    assert isinstance(result.exception, Built), result.output
    dispatch = result.exception.args[0].dispatch
    assert dispatch.warmup_max == expected and dispatch.warmup == 2


def test_measure_hands_warmup_max_to_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, Any] = {}

    def recording_measure(workload: Any, ds_config: Any, options: Any, show_progress: bool = False) -> dict:
        given.update(vars(options))
        return {"status": "ok"}

    monkeypatch.setattr("tuner.measure.run.measure", recording_measure)
    result = runner.invoke(app, ["measure", *TINY, "--warmup", "1", "--warmup-max", "8", "--json"])
    assert result.exit_code == 0, result.output
    assert given["warmup"] == 1 and given["warmup_max"] == 8


def test_tune_on_a_study_of_another_workload_is_refused_and_writes_no_workload(tmp_path: Path) -> None:
    """``tune --study NAME`` where NAME searches another workload: one line naming the workload, exit 2, and no stray
    workload row left behind (it was written before the refusal)."""
    import sqlalchemy as sa

    from tuner.storage import Store
    from tuner.storage.tables import WorkloadRow
    from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    with Store.open(storage) as store:
        theirs = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(128))
        store.get_or_create_study("theirs", store.upsert_workload(theirs), "tpe", {})
    result = runner.invoke(app, ["tune", *TINY, "--launcher", "local", "--storage", storage, "--study", "theirs"])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("error: workload: study 'theirs' was created for workload 1")
    with Store.open(storage) as store, store.session(write=False) as session:
        assert session.scalars(sa.select(WorkloadRow.fingerprint)).all() == [theirs.fingerprint()]
