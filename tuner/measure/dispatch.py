"""Send measured runs to Ray workers (a local Ray by default, a cluster by address), as many at once as fit.

Each run reserves what it needs through the Ray launcher's placement group (GPUs = world size on CUDA, one CPU per
rank on CPU); the dispatcher keeps at most ``cluster resources // world size`` runs in flight so that every
placement group can be granted (one at a time on CPU, where a run's ranks take every core). Runs are plain blocking
calls in a thread pool: the Ray actors do the work.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from tuner.measure.backends.launchers import launcher_for
from tuner.measure.measurement import Measurement, StepHook
from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.workload import TrialConfig, Workload


class Dispatcher:
    """Runs measurements concurrently, bounded by the resources of the Ray cluster (or this machine)."""

    def __init__(self, options: MeasureOptions, device: str, world_size: int) -> None:
        self.options = options
        # A CPU run's ranks use every core of the machine: two at once would measure each other, not the config.
        capacity = self._capacity(device)  # connects to Ray up front where it is used: a bad address fails at once
        self.slots = 1 if device == "cpu" else max(1, capacity // world_size)
        self.pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="dstune-run")
        self.cancelled = threading.Event()

    def _capacity(self, device: str) -> int:
        return launcher_for(self.options).capacity(device)

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        """Start measuring ``trial`` on ``workload``; the future holds the measurement. ``on_step`` sees rank 0's
        timed step times while the run goes on and may stop it early (True)."""
        return self.pool.submit(run_measurement, workload, trial, self.options, cancel=self.cancelled, on_step=on_step)

    def cancel(self) -> None:
        """Kill every run in flight at once (their measurements end ``error`` / ``Cancelled``); no new runs."""
        self.cancelled.set()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def close(self, wait: bool = True) -> None:
        """Stop accepting runs; with ``wait=False`` queued runs are dropped (running ones end with the process)."""
        self.pool.shutdown(wait=wait, cancel_futures=not wait)
