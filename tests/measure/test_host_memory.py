"""A measured run's host memory against this host (tuner.measure.driver.host_memory): a run that would not fit is not
started (``oom`` / HostMemory, at once, no rank), and CPU ranks are capped per CPU."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tuner.errors import InputError
from tuner.estimator import estimate
from tuner.measure.driver.host_memory import HOST_MEMORY, check_cpu_ranks, host_bytes, host_refusal
from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.requests import WorkloadRequest, to_workload
from tuner.workload import TrialConfig, Workload

TRIAL = TrialConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})


def _workload(seq_len: int, gpus: int = 2, device: str = "cpu") -> Workload:
    """tiny-llama at ``seq_len`` (past a request's bound too: the length search's first guess can be)."""
    request = WorkloadRequest(model="tiny-llama", model_impl="builtin", gpus=gpus, device=device, seq_len=256)
    workload = to_workload(request)
    return replace(workload, train=replace(workload.train, seq_len=seq_len))


def test_a_run_past_the_host_is_refused_with_both_figures() -> None:
    long = _workload(34_270_208)  # what tune --seq-len max measured first on CPU ranks with --gpu-memory 80GiB
    est = estimate(long, TRIAL)
    refused = host_refusal(long, est, available=24 * 2**30)
    assert refused is not None and refused.status == "oom" and refused.exception_type == HOST_MEMORY
    assert "not started" in (refused.error or "") and "24.00 GiB is available" in (refused.error or "")
    assert host_bytes(long, est) >= 2 * est.gpu_total  # both CPU ranks' peaks live in the host
    short = _workload(256)
    assert host_refusal(short, estimate(short, TRIAL), available=24 * 2**30) is None


def test_on_gpus_the_host_holds_what_offload_puts_there() -> None:
    offload = TrialConfig(
        {**TRIAL.ds_config, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    )
    request = WorkloadRequest(model="llama-2-7b", model_impl="builtin", gpus=8, device="cuda", seq_len=2048)
    workload = to_workload(request)
    plain, offloaded = estimate(workload, TRIAL), estimate(workload, offload)
    assert host_bytes(workload, offloaded) > host_bytes(workload, plain) + 50 * 2**30  # fp32 Adam states, 7B params
    assert host_refusal(workload, offloaded, available=64 * 2**30) is not None
    assert host_refusal(workload, plain, available=64 * 2**30) is None


def test_run_measurement_refuses_before_any_rank_starts() -> None:
    started = time.monotonic()
    options = MeasureOptions(timeout=600, memory_cap=4 * 2**30)  # were it started, its ranks would stop at 4 GiB
    measurement = run_measurement(_workload(34_270_208), TRIAL, options)
    assert measurement.status == "oom" and measurement.exception_type == HOST_MEMORY
    assert time.monotonic() - started < 60  # no DeepSpeed run: a run of it takes minutes on this host's estimate


def test_cpu_ranks_are_capped_per_cpu() -> None:
    check_cpu_ranks(_workload(256, gpus=8), cpus=2)
    with pytest.raises(InputError, match=r"gpus: 9 CPU ranks on this host's 2 CPUs: at most 8"):
        check_cpu_ranks(_workload(256, gpus=9), cpus=2)
    check_cpu_ranks(_workload(256, gpus=64, device="cuda"), cpus=2)  # GPU ranks: not capped here


def test_a_length_search_on_cpu_ranks_starts_within_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.cli.tune_max import SearchOptions, _within_host
    from tuner.forecast import Pins, longest_fit
    from tuner.measure.driver import host_memory
    from tuner.measure.driver.host_memory import host_share

    workload = _workload(256)  # --gpu-memory 80GiB, the default
    answer = longest_fit(workload, Pins())
    assert answer.seq_len > 10**7  # what the estimator answers for 80 GiB per rank
    shared = host_share(workload, available=24 * 2**30)
    assert shared is not None and shared.cluster.gpu_memory == 12 * 2**30
    assert host_share(workload, available=400 * 2**30) is None  # a host larger than --gpu-memory says
    assert host_share(_workload(256, device="cuda"), available=1) is None
    monkeypatch.setattr(host_memory, "available_memory", lambda: 24 * 2**30)
    options = SearchOptions(MeasureOptions(), None, None, 8, {}, None)
    within = _within_host(workload, Pins(), 2**26, options, answer)
    assert within.seq_len < answer.seq_len
    assert host_refusal(within.workload, within.estimate, available=24 * 2**30) is None
