"""One tuning process for the concurrency tests: ``python tune_proc.py URL STUDY TRIALS SEED LOG``.

The real study loop (:class:`tuner.study.TuningStudy`: ask, estimate, record, tell) on the real store, with a
measurer that does not train: every config it is asked to measure (ds_config and activation checkpointing) is
appended to LOG (one line per measurement, by any process) and answered after a short pause with a throughput derived
from the config. Two such processes on one study show whether a config is ever measured twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from no_fsync import skip_sqlite_fsync

from tuner.measure.measurement import Measurement
from tuner.space import resolve_space
from tuner.storage import Store
from tuner.study import StudySettings, TuningStudy
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model


class LoggingMeasurer:
    """The loop's measurer interface (``slots``, ``submit``, ``cancel``) over a log file instead of ranks."""

    slots = 2

    def __init__(self, log: str) -> None:
        self.log, self.pool = log, ThreadPoolExecutor(max_workers=self.slots)
        self.cancelled = threading.Event()

    def _measure(self, workload: Workload, trial: TrialConfig) -> Measurement:
        key = json.dumps([trial.ds_config, trial.activation_checkpointing], sort_keys=True)
        with open(self.log, "a") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(key + "\n")
        time.sleep(0.05)
        tokens = 1000 + int(hashlib.sha256(key.encode()).hexdigest()[:4], 16) % 1000
        return Measurement(status="ok", tokens_per_s=float(tokens), peak_bytes_per_rank=[1_000_000])

    def submit(self, workload: Workload, trial: TrialConfig, on_step: Any = None) -> Future[Measurement]:
        return self.pool.submit(self._measure, workload, trial)

    def cancel(self) -> None:
        self.cancelled.set()
        self.pool.shutdown(wait=False, cancel_futures=True)


def main() -> int:
    url, study, trials, seed, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    workload = Workload(
        load_builtin_model("tiny-gpt2"),
        ClusterSpec(gpus_per_node=1, device="cpu", gpu_memory=64 * 2**30),
        TrainSpec(32),
    )
    settings = StudySettings(
        name=study,
        workload=workload,
        space_path=resolve_space("default"),
        global_batch=8,
        sampler="random",
        trials=trials,
        seed=seed,
    )
    with Store.open(url) as store:
        report = TuningStudy(settings, store).run(LoggingMeasurer(log))  # type: ignore[arg-type]
    print(json.dumps(report.counts))
    return 0


if __name__ == "__main__":
    skip_sqlite_fsync()  # as the test process itself (tests/conftest.py)
    sys.exit(main())
