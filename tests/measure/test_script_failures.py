"""A training command's end classified from what its processes left (pure logic)."""

from __future__ import annotations

import pytest

from tuner.measure.backends import BACKENDS, backend_for, backend_name
from tuner.measure.backends.launchers import launcher_for
from tuner.measure.options import MeasureOptions
from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.failures import NO_DEEPSPEED, SCRIPT_FAILED, CommandEnd, classify_end, exception_status


def record(phase: str, status: str, line: str, kind: str = "RuntimeError") -> dict[str, object]:
    return {"phase": phase, "status": status, "exception_type": kind, "line": line}


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        # the script's own error before DeepSpeed: not the config's, the study stops with its line
        (
            CommandEnd(
                None, 1, [record("before_initialize", "error", "ModuleNotFoundError: No module named 'x'")], False, ""
            ),
            ("error", SCRIPT_FAILED, "ModuleNotFoundError: No module named 'x'"),
        ),
        # out of memory while building the model (under zero.Init, before initialize) is the config's
        (
            CommandEnd(
                None, 1, [record("before_initialize", "oom", "torch.OutOfMemoryError: CUDA out of memory")], False, ""
            ),
            ("oom", "RuntimeError", "torch.OutOfMemoryError: CUDA out of memory"),
        ),
        # DeepSpeed rejects the config inside initialize
        (
            CommandEnd(
                None, 1, [record("initialize", "invalid_config", "ValidationError: x", "ValidationError")], True, ""
            ),
            ("invalid_config", "ValidationError", "ValidationError: x"),
        ),
        # the host killed a rank: DeepSpeed's launcher reports it
        (
            CommandEnd(None, 1, [], True, "launch.py:312 ... exits with return code = -9"),
            ("oom", "HostKilled", "a rank was killed by SIGKILL (the host's out-of-memory killer does that)"),
        ),
        (CommandEnd(None, 0, [], False, "done"), ("error", SCRIPT_FAILED, NO_DEEPSPEED)),
        (
            CommandEnd(None, 2, [], False, "t.py: error: unrecognized arguments: --nope"),
            ("error", SCRIPT_FAILED, "t.py: error: unrecognized arguments: --nope"),
        ),
    ],
)
def test_what_the_end_says(end: CommandEnd, expected: tuple[str, str, str]) -> None:
    assert classify_end(end, 60.0) == expected


def test_a_hang_is_a_timeout_saying_whether_deepspeed_was_reached() -> None:
    status, kind, line = classify_end(CommandEnd("timeout", None, [], False, ""), 30.0)
    assert (status, kind) == ("timeout", None) and "had not reached deepspeed.initialize" in line


def test_exceptions_in_a_rank() -> None:
    assert exception_status(MemoryError(), "step 1") == "oom"
    assert exception_status(RuntimeError("NCCL error: unhandled cuda error, out of memory"), "step 1") == "oom"
    assert exception_status(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), "step 2") == "oom"
    assert exception_status(AssertionError("train_batch_size"), "initialize") == "invalid_config"
    assert exception_status(AssertionError("mine"), "step 3") == "error"


def test_the_backend_follows_the_options() -> None:
    script = ScriptCommand.of(["python", "t.py"], "/tmp")
    assert backend_name(MeasureOptions()) == "builtin" and type(backend_for(MeasureOptions())).name == "builtin"
    assert type(backend_for(MeasureOptions(script=script))).name == "script"
    assert set(BACKENDS) == {"builtin", "script"}
    assert launcher_for(MeasureOptions(launcher="local")).name == "local"
    assert ScriptCommand.from_dict(script.to_dict()) == script


class DistBackendError(RuntimeError):
    """Named as torch.distributed's (the classifier reads class names, never imports torch)."""


@pytest.mark.parametrize(
    "error",
    [
        # the built-in runs' classifier knows these; the script's own pattern used to miss them
        DistBackendError("NCCL error: unhandled cuda error, NCCL version 2.21.5\ncuMemCreate failed with error 2"),
        DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, Failed to CUDA calloc 4194304 bytes"),
        RuntimeError("CUDA error: CUBLASLT_STATUS_ALLOC_FAILED when calling `cublasLtMatmulAlgoGetHeuristic`"),
        RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`"),
        RuntimeError("CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY"),
        # and the looser words of a user's libraries still are out of memory
        RuntimeError("Failed to allocate 2147483648 bytes"),
        RuntimeError("ncclSystemError: System call (e.g. socket, malloc) or external library call failed: memory"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"),
        MemoryError(),
    ],
)
def test_a_script_exception_reads_as_out_of_memory_in_the_runtimes_and_its_libraries_words(
    error: BaseException,
) -> None:
    assert exception_status(error, "training") == "oom"


@pytest.mark.parametrize(
    "error",
    [RuntimeError("CUDA error: an illegal memory access was encountered"), KeyError("lm_head.weight")],
)
def test_other_script_failures_are_errors(error: BaseException) -> None:
    assert exception_status(error, "training") == "error"
