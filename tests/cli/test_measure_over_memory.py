"""``dstune measure --gpu-memory`` on CPU ranks: a run that trains with its peak above the memory given says so
(``status: ok`` alone would read as "fits"), as a study judges it (``oom``), and a run within it says nothing."""

from __future__ import annotations

from tuner.cli.measure import over_memory
from tuner.requests import WorkloadRequest, to_workload
from tuner.workload import TrialConfig

WORKLOAD = to_workload(WorkloadRequest(model="tiny-llama", gpus=2, device="cpu", gpu_memory="64MiB", seq_len=64))
ZERO3 = TrialConfig({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}, False)


def ran(peak: int, status: str = "ok") -> dict:
    """A measurement's fields over_memory reads (the figure: this run's measured peak, 1,009,885,025 bytes)."""
    return {"status": status, "peak_bytes_per_rank": [peak, peak]}


def test_a_peak_above_the_memory_given_is_said() -> None:
    why = over_memory(WORKLOAD, ZERO3, ran(1_009_885_025))
    assert why is not None and "exceeds the 64.0 MiB given (--gpu-memory)" in why


def test_within_it_or_failed_nothing_is_said() -> None:
    assert over_memory(WORKLOAD, ZERO3, ran(40 * 2**20)) is None
    assert over_memory(WORKLOAD, ZERO3, ran(1_009_885_025, status="error")) is None
