"""The plumbing every command shares: bad input as one line ``error: <field>: <message>`` with exit code 2
(:class:`OneLineErrorGroup` for click's own errors, :func:`fail` for ours), the environment failing (database out of
reach, unknown storage dialect, unwritable path, full disk) as one line with exit code 1 (the one top-level handler,
:mod:`tuner.storage.environment` recognises them), memory sizes, the default device and GiB formatting."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from tuner.cli import terminate
from tuner.errors import InputError
from tuner.units import GiB, parse_bytes

USAGE_EXIT = 2
ENVIRONMENT_EXIT = 1  # the database, a path or the disk failed: the input may be fine

# Typer >= 0.25 vendors click; take its exception classes from the public BadParameter to work with either.
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _print_error(field_name: str, message: str) -> None:
    """Print the one-line ``error: <field>: <message>`` to stderr."""
    typer.echo(f"error: {field_name}: {_one_line(message)}", err=True)


def _click_field(error: Exception) -> str:
    """The option a click error is about, without dashes (``stage`` for ``--stage``)."""
    param = getattr(error, "param", None)
    if param is not None:
        names = [opt for opt in getattr(param, "opts", []) if opt.startswith("--")] or [param.name or "argument"]
        return names[0].lstrip("-")
    option_name = getattr(error, "option_name", None)
    if option_name:
        return option_name.lstrip("-")
    return "usage"


def _click_message(error: Exception) -> str:
    """A click error's message without the ``Invalid value for '--x':`` preamble (the field says it)."""
    if isinstance(error, typer.BadParameter) and error.param is not None and error.message:
        return error.message.removeprefix("Value error, ")
    return error.format_message()  # type: ignore[attr-defined]


class OneLineErrorGroup(TyperGroup):
    """A Typer group that reports usage errors as one ``error: <field>: <message>`` line, not a panel."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Run the command; in standalone mode turn click's errors into one line and exit."""
        kwargs["standalone_mode"] = False  # click raises; this method decides how errors look
        if not standalone_mode:
            return super().main(*args, **kwargs)
        terminate.install()  # SIGTERM stops as Ctrl-C does, and exits 143
        try:
            result = super().main(*args, **kwargs)
        except ClickException as error:
            message = _click_message(error)
            if message:  # empty for a bare ``dstune``: the help was shown already
                _print_error(_click_field(error), message)
            sys.exit(USAGE_EXIT if isinstance(error, UsageError) else getattr(error, "exit_code", 1))
        except InputError as error:  # bad input found below the command's own checks (a DSTUNE_* variable, ...)
            _print_error(error.field, error.message)
            sys.exit(USAGE_EXIT)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(terminate.exit_code(1))
        except Exception as error:  # the environment (database, disk, a path), or a bug: the traceback stays
            _exit_for_environment(error)
            raise
        sys.exit(terminate.exit_code(result if isinstance(result, int) else 0))


def _exit_for_environment(error: BaseException) -> None:
    """Exit 1 with one line ``error: <what>: <where>: <detail>`` when ``error`` is the environment failing (the
    database out of reach, a storage URL no driver speaks, an unwritable path, a full disk); return otherwise."""
    from tuner.storage.environment import environment_failure  # sqlalchemy: only once something failed

    failure = environment_failure(error)
    if failure is not None:
        typer.echo(f"error: {_one_line(str(failure))}", err=True)
        sys.exit(ENVIRONMENT_EXIT)


def fail(field_name: str, message: str) -> NoReturn:
    """Report bad input on one line and exit with code 2."""
    _print_error(field_name, message)
    raise typer.Exit(USAGE_EXIT)


def write_text_file(path: str, text: str) -> None:
    """Write ``text`` to ``path``; a failure (a full disk reported at close, a read-only folder) names the path."""
    try:
        Path(path).write_text(text)
    except OSError as error:
        if error.filename is None:
            raise OSError(error.errno, error.strerror, path) from error
        raise


def size(text: str, flag: str) -> int:
    """A memory size option (``80GiB``, ``512GB`` or bytes) in bytes; bad input fails on one line naming ``flag``."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        fail(flag, str(error))


def default_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu`` (imports torch: only commands that train call it)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def require_local_cuda(device: str | None, launcher: str, ray_address: str | None) -> None:
    """Refuse ``--device cuda`` at once (exit 2 naming ``device``) when the ranks would run on this machine and it
    has no GPU, before Ray or any rank starts. Without a GPU's device files the answer needs no torch (importing it
    takes seconds, a minute on a loaded host); with them, torch decides. Ranks on a Ray cluster (``--ray-address`` or
    ``RAY_ADDRESS``) may have GPUs this machine lacks: they are not refused here. No device (None) means the
    machine's own."""
    if device != "cuda" or (launcher == "ray" and (ray_address or os.environ.get("RAY_ADDRESS"))):
        return
    accelerator = os.environ.get("DS_ACCELERATOR", "cuda")
    if accelerator != "cuda":  # the ranks inherit it: DeepSpeed would train on its accelerator, not the GPUs
        fail("device", f"cuda, but DS_ACCELERATOR={accelerator} in this environment: unset it or set it to cuda")
    if gpu_device_files():
        import torch

        if torch.cuda.is_available():
            return
    fail("device", "cuda, but this machine has no GPU torch can use: use --device cpu, or --ray-address of a cluster")


def memory_cap_bytes(memory_cap: str | None, device: str | None) -> int | None:
    """``--memory-cap`` in bytes; refused (exit 2 naming ``memory-cap``) on CUDA, where an address-space cap
    (``RLIMIT_AS``) breaks ``cuInit``: CUDA reserves virtual address space for the whole device and more."""
    if not memory_cap:
        return None
    if device == "cuda":
        fail("memory-cap", "an address-space cap breaks CUDA's initialisation (cuInit): use it with --device cpu")
    return size(memory_cap, "memory-cap")


def require_ray_nodes(nodes: int, launcher: str, ray_address: str | None) -> None:
    """Refuse at once (exit 2 naming ``nodes``) a layout of several nodes on the local Ray this command would start:
    it is one node, so every run would wait for nodes that never join and end in an error."""
    if nodes > 1 and launcher == "ray" and not (ray_address or os.environ.get("RAY_ADDRESS")):
        fail(
            "nodes",
            f"{nodes} nodes, but the local Ray this starts is one node: give --ray-address of a cluster with "
            f"{nodes} nodes, or --launcher local to run every node's ranks on this machine",
        )


def gpu_device_files() -> bool:
    """Whether this machine has the device files a GPU that torch.cuda drives comes with: NVIDIA's ``/dev/nvidiaN``,
    AMD's ``/dev/kfd`` (ROCm), WSL's ``/dev/dxg``."""
    dev = Path("/dev")
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists() or (dev / "dxg").exists()


def gib(size_bytes: int | None) -> str:
    """Bytes as GiB with two decimals (``unknown`` for None)."""
    return "unknown" if size_bytes is None else f"{size_bytes / GiB:.2f}"


__all__ = [
    "ENVIRONMENT_EXIT",
    "USAGE_EXIT",
    "OneLineErrorGroup",
    "default_device",
    "fail",
    "gib",
    "memory_cap_bytes",
    "require_local_cuda",
    "size",
    "write_text_file",
]
