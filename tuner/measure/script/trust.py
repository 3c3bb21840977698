"""Which training commands a worker runs (:func:`trust_refusal`): a queued job's command runs only on a worker told
which folders it trusts (``dstune worker --allow-scripts DIR``), and only when everything it runs lies in them.

A job's command comes from the database, and whoever can write a job row could otherwise make every worker run
anything. So, beside the rule that only ``dstune queue`` (run by someone holding the database's URL) queues such a job
and the API refuses one (403), the worker checks the command itself before it runs it:

- its folder (``cwd``, symbolic links resolved) lies inside a trusted folder;
- its program is a launcher or an interpreter found on the worker's own ``PATH`` (:data:`LAUNCHERS`), or a file
  inside a trusted folder;
- no argument before the script asks a launcher or an interpreter to run code given inline or another program
  (:data:`INLINE`: ``python -c``, ``-m``, ``torchrun --no-python``...; the script's own flags after it are its own);
- every argument that names an existing file (``train.py``, ``--deepspeed ds.json``, ``--config=cfg.yaml``) names one
  inside a trusted folder.

Example:
    >>> from tuner.measure.script.command import ScriptCommand
    >>> trust_refusal(ScriptCommand(("python", "-c", "print(1)"), "/"), [])
    'this worker runs no training command: start it with --allow-scripts DIR (the folders whose scripts it may run)'
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from tuner.errors import InputError
from tuner.measure.script.command import ScriptCommand

LAUNCHER_NAMES = ("deepspeed", "torchrun", "accelerate")
PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
# arguments that make a launcher or an interpreter run inline code or a program of the command's choosing
INLINE = frozenset({"--module", "--no_python", "--no-python", "--run-path", "--run_path"})
SHORT_INLINE = re.compile(r"-[A-Za-z]*[cm].*")  # python -c / -m, also combined (-Bc, -mpip); accelerate -m
NO_TRUST = (
    "this worker runs no training command: start it with --allow-scripts DIR (the folders whose scripts it may run)"
)


class UntrustedCommand(InputError):
    """A queued job's command outside what this worker was told to trust: the job fails with this, nothing runs."""

    def __init__(self, message: str) -> None:
        super().__init__("script", message)


def _real(path: str | Path) -> Path:
    """``path`` with every symbolic link resolved (what would actually be opened)."""
    return Path(os.path.realpath(path))


def _inside(path: Path, folders: Sequence[Path]) -> bool:
    return any(path == folder or path.is_relative_to(folder) for folder in folders)


def _launcher(name: str) -> bool:
    """Whether a bare program name is a launcher or an interpreter (looked up on the worker's ``PATH``)."""
    return name in LAUNCHER_NAMES or PYTHON.fullmatch(name) is not None


def _program_refusal(program: str, cwd: Path, folders: Sequence[Path]) -> str | None:
    if "/" not in program:
        if _launcher(program):
            return None
        return f"{program!r} is neither a launcher ({', '.join(LAUNCHER_NAMES)}, python) nor a file in a trusted folder"
    if not _inside(_real(cwd / program), folders):
        return f"the program {program} is outside the trusted folders"
    return None


def trust_refusal(command: ScriptCommand, trusted: Sequence[str | Path]) -> str | None:
    """Why this worker, trusting the folders ``trusted``, must not run ``command``; None when it may (see the module
    docstring for the rules)."""
    if not trusted:
        return NO_TRUST
    folders = [_real(folder) for folder in trusted]
    cwd = _real(command.cwd)
    if not _inside(cwd, folders):
        return f"the command's folder {command.cwd} is outside the trusted folders (--allow-scripts)"
    refusal = _program_refusal(command.argv[0], cwd, folders)
    if refusal:
        return refusal
    script_seen = "/" in command.argv[0]  # a program of its own: what follows are its arguments
    for argument in command.argv[1:]:
        if not script_seen and (argument.split("=")[0] in INLINE or SHORT_INLINE.fullmatch(argument)):
            return f"{argument!r} runs code given inline or a program of the command's choosing"
        named = argument.partition("=")[2] if argument.startswith("-") else argument
        if named and (cwd / named).is_file():
            if not _inside(_real(cwd / named), folders):
                return f"{named} is outside the trusted folders"
            script_seen = script_seen or named.endswith((".py", ".sh"))  # the script: its own flags follow
    return None


def check_trusted(command: ScriptCommand, trusted: Sequence[str | Path]) -> None:
    """Raise :class:`UntrustedCommand` with :func:`trust_refusal`'s reason, if any."""
    refusal = trust_refusal(command, trusted)
    if refusal:
        raise UntrustedCommand(refusal)


__all__ = ["LAUNCHER_NAMES", "UntrustedCommand", "check_trusted", "trust_refusal"]
