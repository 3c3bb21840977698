"""What every face says beside a study's measured config, from one reader (tuner.study.answer_facts): the choices
that change the numerics (``--allow-numerics-changes``), whose figures they are (dstune's trainer or the user's
training command) and the independent confirmation run (``--confirm``), on ``/v1/recommend``, the dashboard's study
and trial pages and ``dstune best``. A real SQLite store, the trials recorded as a study records them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tuner.api import create_app
from tuner.cli.app import app as cli_app
from tuner.estimator import estimate
from tuner.requests import WorkloadRequest, to_workload
from tuner.storage import Store
from tuner.study import Confirmation
from tuner.workload import TrialConfig

REQUEST = {"params": 1e8, "gpus": 2, "device": "cpu", "seq_len": 256}
BF16_MASTER = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "train_batch_size": 4,
    "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
    "zero_optimization": {"stage": 1},
}
ARGV = ["deepspeed", "/home/alice/train.py", "--deepspeed", "ds.json"]
SLOT = {"index": 3, "key": None, "source": "--deepspeed", "hf": False}


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'dstune.db'}"


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    with TestClient(create_app(db, "token", recommend_cache_s=0, request_budget_s=600)) as test_client:
        yield test_client


def seed(db: str, script: bool, confirmed: Confirmation | None) -> None:
    """A study whose one measured trial trains with bf16 master weights and optimizer states (``script``: measured
    with the user's training command), confirmed by ``confirmed``."""
    workload = to_workload(WorkloadRequest(**REQUEST))
    settings: dict[str, Any] = {"allow_numerics_changes": True}
    with Store.open(db) as store:
        study = store.get_or_create_study("bf16", store.upsert_workload(workload), "tpe", settings)
        trial_id = store.add_trial(
            study.id, 0, "k0", BF16_MASTER, {}, False, estimate(workload, TrialConfig(BF16_MASTER))
        )
        store.start_trial(trial_id)
        measured: dict[str, Any] = {"tokens_per_s": 1000.0, "peak_bytes_per_rank": [2**30, 2**30]}
        if script:
            measured["script"] = {
                "backend": "script",
                "argv": ARGV,
                "slot": SLOT,
                "targets": {},
                "ds_config": BF16_MASTER,
                "code_paths": {"chunked_loss": True, "liger": False},  # as the rank hook read the command's model
            }
        store.finish_trial(trial_id, "ok", measured)
        if confirmed is not None:
            store.record_confirmation(trial_id, confirmed.to_dict())


def recommended(client: TestClient) -> dict[str, Any]:
    response = client.post("/v1/recommend", json={"workload": REQUEST})
    assert response.status_code == 200, response.text
    return response.json()


def test_recommend_names_the_numerics_choices_and_the_confirmation(client: TestClient, db: str) -> None:
    seed(db, script=False, confirmed=Confirmation(0, "ok", 950.0, 1000.0))
    data = recommended(client)
    assert data["source"] == "measured" and data["measured_with"] == "trainer"
    assert data["numerics"] == ["bf16 master weights and gradients", "bf16 optimizer states"]
    assert data["changes_numerics"] is True
    assert any("changes the numerics" in note for note in data["notes"]), data["notes"]
    confirmation = data["confirmation"]
    assert confirmation["ratio"] == pytest.approx(0.95) and confirmation["holds"] is True
    assert confirmation["tokens_per_s"] == 950.0 and confirmation["trial_tokens_per_s"] == 1000.0
    assert confirmation["line"] == "confirmed by an independent run: 950 tokens/s, 0.95× the trial's 1,000"


def test_a_script_studys_answer_says_its_figures_are_the_commands_and_shows_no_path(
    client: TestClient, db: str
) -> None:
    failed = Confirmation(0, "error", None, 1000.0, error="FileNotFoundError: /home/alice/data.bin")
    seed(db, script=True, confirmed=failed)
    data = recommended(client)
    assert data["measured_with"] == "script" and data["changes_numerics"] is True
    assert data["confirmation"]["holds"] is False and data["confirmation"]["ratio"] is None
    assert "/home/alice" not in str(data), data["confirmation"]
    assert data["confirmation"]["line"] == "not confirmed: the independent run ended error: FileNotFoundError: <path>"


def test_an_estimate_makes_no_numerics_choice_and_has_no_confirmation(client: TestClient) -> None:
    data = recommended(client)
    assert data["source"] == "estimate" and data["numerics"] == [] and data["changes_numerics"] is False
    assert data["measured_with"] is None and data["confirmation"] is None


def test_the_dashboard_shows_the_numerics_choices_and_the_confirmation(client: TestClient, db: str) -> None:
    seed(db, script=False, confirmed=Confirmation(0, "ok", 700.0, 1000.0))
    line = "not confirmed: an independent run measured 700 tokens/s, 0.70× the trial&#39;s 1,000 (below 0.90×)"
    for page in ("/studies/bf16", "/studies/bf16/trials/0"):
        text = client.get(page).text
        assert 'id="confirmation"' in text and line in text, page
        assert "changes the numerics against fp32-master Adam: bf16 master weights and gradients" in text, page
    assert 'id="numerics-allowed"' in client.get("/studies/bf16").text  # the study was allowed to choose them


def test_best_of_a_script_study_says_its_config_changes_the_numerics(db: str) -> None:
    seed(db, script=True, confirmed=Confirmation(0, "ok", 980.0, 1000.0))
    done = CliRunner().invoke(cli_app, ["best", "--study", "bf16", "--storage", db])
    assert done.exit_code == 0, done.output
    assert "changes the numerics against fp32-master Adam: bf16 master weights and gradients" in done.output
    assert "confirmed by an independent run: 980 tokens/s, 0.98× the trial's 1,000" in done.output
    said = "your command's model ran DeepSpeed's chunked cross-entropy loss, not Liger-Kernel's kernels"
    assert said in done.output
    client = TestClient(create_app(db, "token", recommend_cache_s=0, request_budget_s=600))
    assert said.replace("'", "&#39;") in client.get("/studies/bf16").text
    assert said in recommended(client)["notes"]


def test_the_tune_report_says_the_winners_config_changes_the_numerics(db: str) -> None:
    from rich.console import Console

    from tuner.cli.study_view import render_study

    seed(db, script=False, confirmed=None)
    console = Console(record=True, width=200)
    with Store.open(db) as store:
        study = store.get_study("bf16")
        assert study is not None
        render_study(store, study.id, "bf16", console)
    said = console.export_text()
    assert "changes the numerics against fp32-master Adam: bf16 master weights and gradients" in said, said
