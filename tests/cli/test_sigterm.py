"""SIGTERM (what timeout, systemd and docker stop send), SIGHUP (a closed terminal), SIGQUIT, SIGUSR1 and SIGUSR2 stop a
command as Ctrl-C does: one line, the command's own Ctrl-C path, exit 128 + the signal (tuner.cli.terminate). The
study-level reproduction (no trial left running) is
tests/cli/test_tune.py::test_ctrl_c_stops_after_recording_what_finished, run with SIGTERM too."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

DSTUNE = str(Path(sys.executable).with_name("dstune"))


def _has_tables(db: Path) -> bool:
    if not db.exists():
        return False
    try:
        with sqlite3.connect(db) as connection:
            return connection.execute("select count(*) from sqlite_master where name='dstune_jobs'").fetchone()[0] == 1
    except sqlite3.Error:
        return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1])
def test_a_stop_signal_stops_a_worker_as_ctrl_c_does_with_a_line_and_exit_128_plus_it(
    tmp_path: Path, stop: signal.Signals
) -> None:
    db = tmp_path / "dstune.db"
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        process = subprocess.Popen(
            [DSTUNE, "worker", "--storage", f"sqlite:///{db}", "--poll", "0.2"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=lambda: [signal.signal(one, signal.SIG_DFL) for one in (signal.SIGINT, stop)],
        )
    try:
        deadline = time.monotonic() + 120
        while not _has_tables(db):  # the store is open: the worker polls its queue
            assert process.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        process.send_signal(stop)
        code = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = err.read_text()
    assert code == 128 + stop, text
    assert f"terminated ({stop.name})" in text and "Traceback" not in text
