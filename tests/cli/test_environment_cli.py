"""The environment failing under the CLI: an unknown storage dialect, an unparsable URL, a SQLite file in
a missing or unwritable folder, a database host that does not resolve, a refused connection past the retry window,
an unwritable or full ``--out``: one line ``error: ...`` naming what and where, exit 1 (2 stays for bad input), no
traceback, and a failure that waiting will not cure is reported at once, not after the retry window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.api.test_api import GPT2, ds_config, seed_study
from tuner.cli.app import app
from tuner.requests import WorkloadRequest, to_workload
from tuner.storage import Store

BAD_URLS = [("mongodb://db.example/dstune", "mongodb"), ("not a url", "parse")]  # input: exit 2
BAD_STORAGE = [
    ("sqlite:////no/such/folder/dstune.db", "/no/such/folder"),
    ("sqlite:////proc/dstune.db", "/proc/dstune.db"),
    ("postgresql+psycopg://u:secret@no-such-host.invalid/dstune", "no-such-host.invalid"),
]
RETRY_S = 600  # the retry window the tests set: a failure reported "at once" takes a fraction of it, however loaded
AT_ONCE_S = RETRY_S / 2
COMMANDS = [
    ["best", "--study", "x"],
    ["worker", "--once"],
    ["tune", "--model", "tiny-gpt2", "--device", "cpu", "--seq-len", "64"],
]


def _run(args: list[str], **env: str) -> tuple[int, str, float]:
    started = time.perf_counter()
    result = CliRunner().invoke(app, args, env={"DSTUNE_DB_RETRY_S": str(RETRY_S), **env})
    return result.exit_code, result.stderr, time.perf_counter() - started


def _one_line_exit_1(code: int, stderr: str, where: str) -> None:
    assert code == 1, stderr
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith("error: "), stderr
    assert where in stderr and "Traceback" not in stderr and "secret" not in stderr


@pytest.mark.parametrize(("url", "where"), BAD_STORAGE)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_storage_that_cannot_be_used_is_one_line_at_once(url: str, where: str, command: list[str]) -> None:
    if command[0] == "worker" and "--once" not in _help("worker"):
        command = ["worker"]
    code, stderr, seconds = _run([*command, "--storage", url])
    _one_line_exit_1(code, stderr, where)
    assert seconds < AT_ONCE_S  # not the retry window


@pytest.mark.parametrize(("url", "where"), BAD_URLS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_storage_url_of_no_dialect_is_bad_input_exit_2(url: str, where: str, command: list[str]) -> None:
    code, stderr, _ = _run([*command, "--storage", url])
    assert code == 2, stderr
    assert stderr.startswith("error: storage: ") and len(stderr.strip().splitlines()) == 1, stderr
    assert where in stderr and "Traceback" not in stderr


def _help(command: str) -> str:
    return CliRunner().invoke(app, [command, "--help"]).stdout


def test_a_database_refusing_at_start_up_is_one_error_line_at_once() -> None:
    """The console command as a user runs it, against a database it never reached: one line says why, within the
    start-up window (a few seconds), not the window an outage of a database it was using is waited out; no line per
    retry, no traceback, no password."""
    dstune = str(Path(sys.executable).with_name("dstune"))
    url = "postgresql+psycopg://u:secret@127.0.0.1:1/db"
    started = time.monotonic()
    done = subprocess.run(
        [dstune, "best", "--study", "x", "--storage", url],
        capture_output=True,
        text=True,
        env={**os.environ, "DSTUNE_DB_RETRY_S": str(RETRY_S)},
        timeout=120,
    )
    _one_line_exit_1(done.returncode, done.stderr, "127.0.0.1:1")
    assert done.stderr.startswith("error: database unavailable: "), done.stderr
    assert time.monotonic() - started < AT_ONCE_S  # not the retry window


def test_serve_with_bad_storage_is_one_line_exit_2(tmp_path: Path) -> None:
    dstune = str(Path(sys.executable).with_name("dstune"))
    env = {**os.environ, "DSTUNE_API_TOKEN": "x"}
    done = subprocess.run(
        [dstune, "serve", "--storage", "mongodb://db/x"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2 and done.stderr.startswith("error: storage: ") and "mongodb" in done.stderr


@pytest.fixture
def measured(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    with Store.open(url) as store:
        seed_study(store, "s", to_workload(WorkloadRequest(**GPT2)), [(ds_config(1, 2), "ok", 100.0, 2**30)])
    return url


@pytest.mark.parametrize(("out", "where"), [("/dev/full", "/dev/full"), ("/proc/x.json", "/proc/x.json")])
def test_best_out_that_cannot_be_written_is_one_line(measured: str, tmp_path: Path, out: str, where: str) -> None:
    if not Path("/dev/full").exists() and out == "/dev/full":
        pytest.skip("no /dev/full here")
    code, stderr, _ = _run(["best", "--study", "s", "--storage", measured, "--out", out])
    _one_line_exit_1(code, stderr, where)


def test_best_out_naming_the_studys_database_leaves_it_whole(measured: str) -> None:
    database = measured.removeprefix("sqlite:///")
    before = Path(database).read_bytes()
    code, stderr, _ = _run(["best", "--study", "s", "--storage", measured, "--out", database])
    assert code == 2 and stderr.startswith("error: out: ") and "SQLite database" in stderr, stderr
    assert Path(database).read_bytes() == before


def test_best_out_over_a_file_that_is_not_json_leaves_it_whole(measured: str, tmp_path: Path) -> None:
    notes = tmp_path / "train.py"
    notes.write_text("print('my training script')\n")
    code, stderr, _ = _run(["best", "--study", "s", "--storage", measured, "--out", str(notes)])
    assert code == 2 and stderr.startswith("error: out: ") and "not JSON" in stderr, stderr
    assert notes.read_text() == "print('my training script')\n"
    earlier = tmp_path / "ds_config.json"
    earlier.write_text('{"old": true}\n')  # an earlier export is written over
    code, stderr, _ = _run(["best", "--study", "s", "--storage", measured, "--out", str(earlier)])
    assert code == 0, stderr
    assert "train_micro_batch_size_per_gpu" in earlier.read_text()
