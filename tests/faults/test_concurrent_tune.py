"""Two tuning processes on one study name at once (same seed, so they propose the same configs at the same moments):
each config is measured once, by one of them, and both finish cleanly."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna

from tuner.storage import Store

TUNE = Path(__file__).with_name("tune_proc.py")


def test_two_tuners_on_one_study_measure_each_config_once(url: str, tmp_path: Path) -> None:
    log = tmp_path / "measured.log"
    log.touch()
    with Store.open(url):
        pass  # migrated once up front, as `dstune tune` would have
    processes = [
        subprocess.Popen(
            [sys.executable, str(TUNE), url, "shared", "30", "7", str(log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [err[-8000:] for _, err in outputs]
    measured = Counter(log.read_text().splitlines())
    assert measured and max(measured.values()) == 1, measured.most_common(3)
    with Store.open(url) as store:
        trials = store.trials(store.get_study("shared").id)
    ok = [t for t in trials if t.status == "ok"]
    assert len(ok) == sum(measured.values()) and all(t.attempts == 1 for t in ok)
    assert not [t for t in trials if t.status in ("running", "pending")]
    study = optuna.load_study(study_name="shared", storage=url)
    assert len(study.trials) >= 30
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
