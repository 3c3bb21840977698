"""Every way a GPU rank runs out of memory is ``oom``: from the exception it raised (messages as torch, NCCL, cuBLAS
and the CUDA runtime print them, copied from real reports), from the exit and log of a rank that died without a
report, and from the kernel's OOM kill; a rank whose collective broke after a peer's OOM is not the cause."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tuner.measure.driver.outcomes import collect_rank
from tuner.measure.driver.processes import RankProcess
from tuner.measure.measurement import RankResult, aggregate
from tuner.measure.oom import cgroup_oom_kills, exit_status, follows_peer, kills_between, oom_error
from tuner.measure.rank.training import classify
from tuner.workload.model import model_from_param_count

ALLOCATOR = (
    "CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.03 GiB is "
    "free. Process 1234 has 78.06 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and "
    "1.11 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
NCCL_LAZY = (
    "NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function "
    "failed.\nLast error:\nCuda failure 2 'out of memory'"
)
NCCL_CALLOC = "NCCL WARN Failed to CUDA calloc 6291456 bytes\nncclUnhandledCudaError: Call to CUDA function failed."
NCCL_CUMEM = "include/alloc.h:125 NCCL WARN Call to cuMemCreate failed with error 2"
CUBLAS = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
RAW_CUDA = (
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)
WATCHDOG_OOM = (
    "terminate called after throwing an instance of 'c10::DistBackendError'\n  what():  [PG ID 0 PG GUID 0(default_pg)"
    " Rank 1] Process group watchdog thread terminated with exception: CUDA error: out of memory"
)
WATCHDOG_TIMEOUT = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=262144, "
    "NumelOut=262144, Timeout(ms)=120000) ran for 120004 milliseconds before timing out."
)
NOT_MEMORY = (
    "CUDA error: an illegal memory access was encountered",
    "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5",
    "KeyError: 'lm_head.weight'",
    "CUDA error: device-side assert triggered",
)


@pytest.mark.parametrize(
    ("exception_type", "message"),
    [
        ("torch.OutOfMemoryError", ALLOCATOR),
        ("torch.cuda.OutOfMemoryError", ALLOCATOR),
        ("torch.distributed.DistBackendError", NCCL_LAZY),
        ("torch.distributed.DistBackendError", NCCL_CALLOC),
        ("torch.distributed.DistBackendError", NCCL_CUMEM),
        ("RuntimeError", CUBLAS),
        ("RuntimeError", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle, ...)`"),
        ("RuntimeError", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        ("RuntimeError", RAW_CUDA),
        ("RuntimeError", "CUDA driver error: out of memory"),
        ("torch.AcceleratorError", "CUDA error: out of memory"),
        ("RuntimeError", "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: 2 GB"),
        ("builtins.MemoryError", ""),
    ],
)
def test_every_out_of_memory_is_oom(exception_type: str, message: str) -> None:
    assert oom_error(exception_type, message)


@pytest.mark.parametrize("message", NOT_MEMORY)
def test_other_cuda_failures_are_not_oom(message: str) -> None:
    assert not oom_error("RuntimeError", message)


def test_the_rank_classifies_a_wrapped_cuda_failure_as_oom() -> None:
    """The exceptions a rank raises: cuBLAS's and NCCL's are RuntimeErrors, sometimes wrapped by DeepSpeed."""
    assert classify(RuntimeError(CUBLAS)) == "oom"
    assert classify(torch.distributed.DistBackendError(NCCL_LAZY)) == "oom"
    try:
        try:
            raise RuntimeError(RAW_CUDA)
        except RuntimeError as inner:
            raise ValueError("engine setup failed") from inner
    except ValueError as outer:
        assert classify(outer) == "oom"
    assert classify(RuntimeError(NOT_MEMORY[0])) == "error"


def test_a_rank_dead_without_a_report_is_classified_from_its_exit() -> None:
    assert exit_status(-signal.SIGABRT, WATCHDOG_OOM) == "oom"  # the watchdog's abort on its own OOM
    assert exit_status(-signal.SIGKILL, "", oom_kills=1) == "oom"  # the host's OOM killer
    assert exit_status(137, "", oom_kills=2) == "oom"  # the same through a shell
    assert exit_status(-signal.SIGKILL, "", oom_kills=0) == "error"  # someone's kill -9
    assert exit_status(1, "Traceback ... KeyError") == "error"


def test_a_watchdog_abort_follows_its_peer_and_the_run_is_the_peers_oom() -> None:
    """Rank 1's watchdog gave up on rank 0, which had run out of memory: stamped first (its poll came first), it is
    still not the cause."""
    assert follows_peer(WATCHDOG_TIMEOUT) and not follows_peer(WATCHDOG_OOM)
    ranks = [
        RankResult(0, "oom", exception_type="torch.OutOfMemoryError", error=ALLOCATOR, failed_at=12.0),
        RankResult(
            1, "error", exception_type="torch.distributed.DistBackendError", error=WATCHDOG_TIMEOUT, failed_at=11.0
        ),
    ]
    assert aggregate(ranks, model_from_param_count(1e6), 64, 2, 2).status == "oom"


def _died(tmp_path: Path, how: str) -> RankProcess:
    log = tmp_path / "rank-0.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(["sh", "-c", how], stdout=sink, stderr=subprocess.STDOUT)
        process.wait()
    return RankProcess(0, process, log)


def test_a_process_killed_by_the_oom_killer_is_oom(tmp_path: Path) -> None:
    """A real process that died of SIGKILL: ``oom`` when the kernel counted an OOM kill meanwhile, else ``error``."""
    killed = _died(tmp_path, "kill -9 $$")
    assert collect_rank(tmp_path, killed, oom_kills=1).status == "oom"
    assert "OOM kill" in (collect_rank(tmp_path, killed, oom_kills=1).error or "")
    assert collect_rank(tmp_path, killed).status == "error"


def test_a_process_that_printed_a_cuda_oom_and_exited_is_oom(tmp_path: Path) -> None:
    died = _died(tmp_path, f"printf '%s' \"{RAW_CUDA}\"; exit 1")
    assert collect_rank(tmp_path, died).status == "oom"


def test_the_cgroups_oom_kill_count_is_read(tmp_path: Path) -> None:
    (tmp_path / "proc").write_text("0::/system.slice/dstune-worker@1.service\n")
    group = tmp_path / "fs" / "system.slice" / "dstune-worker@1.service"
    group.mkdir(parents=True)
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert cgroup_oom_kills(tmp_path / "fs", tmp_path / "proc") == 2
    assert cgroup_oom_kills(tmp_path / "none", tmp_path / "proc") is None
    assert kills_between(2, 3) == 1 and kills_between(None, 3) == 0
    assert cgroup_oom_kills() is None or cgroup_oom_kills() >= 0  # this machine's own, where readable
