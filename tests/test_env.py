"""One settings object for every ``DSTUNE_*`` variable (:mod:`tuner.env`), honoured by every command: the database
from ``DSTUNE_STORAGE`` for ``best``, ``worker`` and the API; a bad value is one line naming the variable, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner import env
from tuner.api.app import create_app_from_env
from tuner.cli.app import app
from tuner.estimator import estimate
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _study_with_a_best_trial(url: str) -> None:
    work = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(64))
    with Store.open(url) as store:
        study = store.get_or_create_study("from-env", store.upsert_workload(work), "tpe", {})
        config = shortcut_config(2, 1, "bf16", 2, "none", "none") | {"train_batch_size": 4}
        trial_id = store.add_trial(study.id, 0, "k0", config, {}, False, estimate(work, config))
        store.start_trial(trial_id)
        store.finish_trial(trial_id, "ok", {"status": "ok", "tokens_per_s": 1000.0, "peak_bytes_per_rank": [2**24]})


def test_defaults_and_types() -> None:
    settings = env.DstuneEnv(_env_file=None)
    assert settings.storage_url == "sqlite:///dstune.db" or settings.storage is not None
    assert env.DstuneEnv.model_fields.keys() >= {"storage", "job_lease_s", "request_budget_s", "profile_cache"}


def test_every_variable_read_anywhere_is_a_setting_or_a_launcher_protocol_variable() -> None:
    """No module reads a ``DSTUNE_*`` variable behind the settings object's back."""
    protocol = {
        "DSTUNE_THREADS_PER_RANK",
        "DSTUNE_BIND_CORES",
        "DSTUNE_SPAWNED_AT",
        "DSTUNE_FORKSERVER_ROOM",
        "DSTUNE_SCRIPT_RUN",  # the run folder dstune's hook in a training command's ranks writes to
        "DSTUNE_SCRIPT_ROOT",  # where that hook imports dstune from
    }
    declared = {env.PREFIX + name.upper() for name in env.DstuneEnv.model_fields}
    for path in set((ROOT / "tuner").rglob("*.py")) - {ROOT / "tuner" / "env.py"}:
        text = path.read_text()
        for match in re.finditer(r"environ(?:\.get)?\(?\[?\s*[\"'](DSTUNE_[A-Z_]+)", text):
            assert match.group(1) in protocol, f"{path}: reads {match.group(1)} directly; use tuner.env.current()"
        for name in re.findall(r"DSTUNE_[A-Z_]+", text):
            assert name in declared | protocol | {"DSTUNE_"}, f"{path}: {name} is not a setting"


def test_storage_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'team.db'}"
    monkeypatch.setenv("DSTUNE_STORAGE", url)
    monkeypatch.chdir(tmp_path)
    assert env.storage_url() == url
    _study_with_a_best_trial(url)
    result = runner.invoke(app, ["best", "--study", "from-env"])
    assert result.exit_code == 0, result.output
    assert '"train_micro_batch_size_per_gpu": 2' in result.stdout
    assert not (tmp_path / "dstune.db").exists()  # nothing written beside it
    result = runner.invoke(app, ["worker", "--once"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "dstune.db").exists()
    monkeypatch.setenv("DSTUNE_REQUEST_BUDGET_S", "3.5")
    api = create_app_from_env()
    assert api.state.store.url == url
    api.state.store.close()
    # the flag still wins
    other = f"sqlite:///{tmp_path / 'other.db'}"
    result = runner.invoke(app, ["best", "--study", "from-env", "--storage", other])
    assert result.exit_code == 2 and "no study named 'from-env'" in result.output


@pytest.mark.parametrize(
    ("variable", "value"), [("DSTUNE_JOB_LEASE_S", "soon"), ("DSTUNE_PROFILE_QUEUE", "0"), ("DSTUNE_DB_RETRY_S", "x")]
)
def test_a_bad_value_is_one_line_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    with pytest.raises(env.InputError) as raised:
        env.current()
    assert raised.value.field == variable
    result = runner.invoke(app, ["worker", "--once"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {variable}: "), result.output
