"""Hostile input at the CLI: backtracking patterns end at once, non-finite numbers in --ds-config and
--peft files, study names outside the one rule (empty, control characters, emoji, 300 characters) are one line
``error: <field>: ...`` with exit 2, before any database row is written."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

ESTIMATE = ["estimate", "--model", "tiny-gpt2", "--device", "cpu", "--model-impl", "builtin"]


def _run(args: list[str]) -> tuple[int, str, float]:
    started = time.perf_counter()
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stderr, time.perf_counter() - started


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize(
    ("flag", "document", "field"),
    [
        ("--ds-config", '{{"gradient_clipping": {bad}}}', "ds-config.gradient_clipping"),
        (
            "--ds-config",
            '{{"optimizer": {{"params": {{"betas": [0.9, {bad}]}}}}}}',
            "ds-config.optimizer.params.betas.1",
        ),
        ("--peft", '{{"r": 8, "lora_alpha": {bad}, "target_modules": ["c_attn"]}}', "peft.lora_alpha"),
    ],
)
def test_non_finite_numbers_in_files_exit_2(tmp_path: Path, bad: str, flag: str, document: str, field: str) -> None:
    path = tmp_path / "doc.json"
    path.write_text(document.format(bad=bad))
    code, stderr, _ = _run([*ESTIMATE, flag, str(path)])
    assert code == 2, stderr
    assert stderr.startswith(f"error: {field}: must be a finite number"), stderr
    assert len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("pattern", ["(.|.)*z", "(a+)+$", "((a*)*)*b"])
def test_backtracking_freeze_ends_at_once(pattern: str) -> None:
    code, stderr, seconds = _run([*ESTIMATE, "--freeze", pattern])
    assert seconds < 30
    assert code in (0, 2), stderr  # estimated, or refused naming freeze (it may match nothing)
    assert code == 0 or stderr.startswith("error: freeze: ")


@pytest.mark.parametrize("pattern", ["(a)\\1", "(?=x)y"])
def test_patterns_re2_cannot_run_exit_2(pattern: str) -> None:
    code, stderr, _ = _run([*ESTIMATE, "--freeze", pattern])
    assert code == 2
    assert stderr.startswith("error: freeze: not a regular expression RE2 can run")


@pytest.mark.parametrize("name", ["", " ", "a\x01b", "a\x00b", "\U0001f600", "x" * 300, "-dash"])
def test_tune_study_names_follow_the_one_rule(tmp_path: Path, name: str) -> None:
    db = tmp_path / "dstune.db"
    args = ["tune", "--model", "tiny-gpt2", "--seq-len", "64", "--device", "cpu", "--trials", "1"]
    args += ["--storage", f"sqlite:///{db}"]
    code, stderr, _ = _run([*args, "--study", name])
    assert code == 2, stderr
    assert stderr.startswith("error: study: "), stderr
    if db.exists():
        with sqlite3.connect(db) as connection:
            tables = [t for (t,) in connection.execute("select name from sqlite_master where type='table'")]
            for table in (t for t in tables if t.startswith("dstune_")):
                assert connection.execute(f"select count(*) from {table}").fetchone() == (0,), table


@pytest.mark.parametrize("name", ["a\x00b", "x" * 300])
def test_best_study_names_outside_storage_exit_2(tmp_path: Path, name: str) -> None:
    code, stderr, _ = _run(["best", "--study", name, "--storage", f"sqlite:///{tmp_path / 'd.db'}"])
    assert code == 2
    assert stderr.startswith("error: study: ")
    json.dumps(stderr)


@pytest.mark.parametrize(
    "command", [["estimate", "--model"], ["estimate", "--model", "tiny-gpt2", "--ds-config"], ["queue"]]
)
def test_a_file_nested_past_the_json_parsers_limit_is_one_line_exit_2(tmp_path: Path, command: list[str]) -> None:
    """A config.json or a queued job nested 5,000 deep made Python's json raise RecursionError: a traceback, exit 1."""
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * 5000 + "1" + "}" * 5000)
    storage = ["--storage", f"sqlite:///{tmp_path / 'q.db'}"] if command == ["queue"] else []
    code, err, _ = _run([*command, str(path), *storage])
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err
