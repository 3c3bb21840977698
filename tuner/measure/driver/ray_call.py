"""Run a whole measurement function inside a Ray task that holds a run's resources (its ranks' GPUs on CUDA, one CPU
per rank on CPU), for backends that start their own processes there (the user's training command)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ray

from tuner.measure.driver.ray_launcher import LOST, ensure_ray
from tuner.measure.measurement import CANCELLED, INFRA_LOST, Measurement

POLL_S = 0.5


def call_on_ray(
    run: Callable[..., Measurement],
    args: tuple[Any, ...],
    world: int,
    device: str,
    cancel: threading.Event | None,
    address: str | None,
) -> Measurement:
    """``run(*args)`` in a Ray task on one node; ``cancel`` interrupts it (the task's ``finally`` stops what it
    started); a lost node or worker is :data:`~tuner.measure.measurement.INFRA_LOST`."""
    ensure_ray(address)
    cuda = device == "cuda"
    task = ray.remote(run).options(num_cpus=0 if cuda else world, num_gpus=world if cuda else 0, max_retries=0)
    ref = task.remote(*args)
    while True:
        ready, _ = ray.wait([ref], timeout=POLL_S)
        if ready:
            break
        if cancel is not None and cancel.is_set():
            ray.cancel(ref)  # KeyboardInterrupt in the task: its finally stops the command's processes
            return Measurement(status="error", exception_type=CANCELLED, error="killed: the study was stopped")
    try:
        result: Measurement = ray.get(ref)
    except LOST as error:
        return Measurement(status="error", exception_type=INFRA_LOST, error=f"the run's Ray worker was lost: {error}")
    return result
