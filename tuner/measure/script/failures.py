"""What a training command's end says, from what its processes did (not from words anywhere in its output).

Each process that ends on an exception leaves a record (the rank hook: its type, its last traceback line, the phase
it was in); a rank the host killed shows in its launcher's report of the exit signal. From those and how the command
ended (:func:`classify_end`): out of memory (CUDA, NCCL, cuBLAS, the CPU allocator, a rank killed by the host), the
script's own error (its last traceback line), a timeout or hang, the infrastructure. A failure before
``deepspeed.initialize`` is reached, a command that fails without any rank starting, or one that never calls
``deepspeed.initialize`` is not the config's: :data:`SCRIPT_FAILED`, and the study stops at that trial
(:class:`ScriptFailed`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tuner.errors import InputError
from tuner.measure.oom import oom_worded
from tuner.units import format_bytes

SCRIPT_FAILED = "ScriptFailed"  # not the config's fault: the study stops with the line
NO_DEEPSPEED = (
    "the command ended without reaching deepspeed.initialize (nor the HF Trainer's or accelerate's DeepSpeed path): "
    "dstune measures DeepSpeed training only"
)
CONFIG_TYPES = frozenset({"ValidationError", "AssertionError", "DeepSpeedConfigError"})
ZERO_INIT = "zero.Init"  # the phase of a failure inside deepspeed.zero.Init: it reads the trial's config
CONFIG_PHASES = frozenset({"initialize", ZERO_INIT})
# a launcher's report of a rank killed by SIGKILL (the host's OOM killer): DeepSpeed's, torchrun's, plain
HOST_KILLED = re.compile(r"return code = -9\b|Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b|killed by signal 9")


class ScriptFailed(InputError):
    """A command failed in a way no config can fix (its own error before DeepSpeed, a bad flag, no DeepSpeed at
    all): the study stops at its first trial with this line."""

    def __init__(self, line: str) -> None:
        super().__init__("command", line)


def exception_status(error: BaseException, phase: str) -> str:
    """``oom`` (:func:`tuner.measure.oom.oom_worded`: the built-in runs' classifier with the looser words of a
    user's libraries), ``invalid_config`` (DeepSpeed rejected the config inside ``deepspeed.initialize`` or
    ``deepspeed.zero.Init``) or ``error``.

    >>> exception_status(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"), "x")
    'oom'
    >>> exception_status(ValueError("bad shape"), "training")
    'error'
    """
    if oom_worded(type(error).__name__, f"{type(error).__name__}: {error}"):
        return "oom"
    if phase in CONFIG_PHASES and type(error).__name__ in CONFIG_TYPES:
        return "invalid_config"
    return "error"


@dataclass(frozen=True)
class CommandEnd:
    """How the command ended and what its processes left: ``killed_for`` (``timeout``, ``cancelled``, ``peer``:
    a rank failed and the rest hung; ``host_memory``: past the host's memory, ``over_memory`` its resident bytes and
    cap; None: it ended itself), its exit code, the error records (earliest first), whether any rank reached
    ``deepspeed.initialize``, and the tail of its output."""

    killed_for: str | None
    exit_code: int | None
    errors: list[dict[str, Any]]
    initialized: bool
    log_tail: str
    over_memory: tuple[int, int] | None = None  # resident bytes and cap of a command stopped past the host's memory


def classify_end(end: CommandEnd, timeout_s: float) -> tuple[str, str | None, str]:
    """(status, exception type, one line) for a command that did not report every rank ok.

    >>> classify_end(CommandEnd(None, 1, [{"phase": "before_initialize", "status": "error",
    ...     "exception_type": "FileNotFoundError", "line": "FileNotFoundError: data.jsonl"}], False, ""), 60)
    ('error', 'ScriptFailed', 'FileNotFoundError: data.jsonl')
    >>> classify_end(CommandEnd("timeout", None, [], True, ""), 60)[:2]
    ('timeout', None)
    """
    last_line = _last_line(end.log_tail)
    if end.killed_for == "timeout":
        where = "" if end.initialized else " (it had not reached deepspeed.initialize)"
        return "timeout", None, f"killed at the run timeout ({timeout_s:g} s){where}"
    if end.killed_for == "cancelled":
        return "error", "Cancelled", "killed: the study was stopped"
    if end.killed_for == "host_memory" and end.over_memory:  # tuner.measure.driver.rss_watch's OVER_MEMORY
        held, cap = end.over_memory
        line = (
            f"killed holding {format_bytes(held)} of this host's memory, past the {format_bytes(cap)} it had available"
        )
        return "oom", "HostMemory", line  # tuner.measure.driver.host_memory's HOST_MEMORY
    oom = next((e for e in end.errors if e["status"] == "oom"), None)
    if oom is not None:
        return "oom", oom["exception_type"], oom["line"]
    if HOST_KILLED.search(end.log_tail):
        return "oom", "HostKilled", "a rank was killed by SIGKILL (the host's out-of-memory killer does that)"
    if end.errors:
        first = end.errors[0]
        if first["phase"] == "before_initialize" and not end.initialized:
            return "error", SCRIPT_FAILED, first["line"]
        return first["status"], first["exception_type"], first["line"]
    if not end.initialized:
        if end.exit_code == 0:
            return "error", SCRIPT_FAILED, NO_DEEPSPEED
        return "error", SCRIPT_FAILED, last_line or f"the command exited with code {end.exit_code}"
    how = "a rank failed and the others hung" if end.killed_for == "peer" else f"exited with code {end.exit_code}"
    return "error", "ProcessExit", f"{how}: {last_line}" if last_line else how


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
