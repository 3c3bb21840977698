"""What a command's ``"auto"`` precision becomes: the HF Trainer fills an ``auto`` ``bf16``/``fp16`` section from its
own ``--bf16``/``--fp16`` arguments (or those keys of a framework's config file), accelerate from its
``--mixed_precision`` (a flag of ``accelerate launch``, or its config file's key); neither set trains in fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.placement import CONFIG_SUFFIXES, ConfigSlot, _load, split_equals
from tuner.workload.vocabulary import Precision

TRUE = frozenset({"true", "1", "yes", "y", "t"})  # HfArgumentParser's string_to_bool; a bare --bf16 is true too


def _hf_flag(argv: tuple[str, ...], name: str) -> bool:
    """Whether ``--name`` is set true the way HfArgumentParser reads a bool field (``--bf16``, ``--bf16 True``)."""
    flag = f"--{name}"
    if flag not in argv:
        return False
    index = argv.index(flag) + 1
    return index == len(argv) or argv[index].startswith("-") or argv[index].lower() in TRUE


def _mixed(value: Any) -> Precision | None:
    text = str(value).lower() if value is not None else ""
    return "bf16" if text == "bf16" else "fp16" if text == "fp16" else None


def _config_files(argv: tuple[str, ...], cwd: Path) -> list[Any]:
    return [_load(cwd / arg) for arg in argv if arg.endswith(CONFIG_SUFFIXES) and (cwd / arg).is_file()]


def auto_precision(command: ScriptCommand, slot: ConfigSlot) -> Precision:
    """The precision the command's trainer fills an ``auto`` ``bf16``/``fp16`` section with.

    >>> auto_precision(ScriptCommand(("python", "t.py", "--deepspeed", "a.json", "--bf16"), "."),
    ...                ConfigSlot(3, None, "--deepspeed", hf=True))
    'bf16'
    >>> auto_precision(ScriptCommand(("accelerate", "launch", "--mixed_precision=fp16", "t.py"), "."),
    ...                ConfigSlot(0, None, "--deepspeed_config_file"))
    'fp16'
    """
    argv = split_equals(command.argv)
    if slot.hf and slot.key is None:
        return "bf16" if _hf_flag(argv, "bf16") else "fp16" if _hf_flag(argv, "fp16") else "fp32"
    if slot.hf:  # a framework's config file holds the Trainer's arguments
        data = _load(Path(command.cwd) / argv[slot.index])
        return "bf16" if data.get("bf16") else "fp16" if data.get("fp16") else "fp32"
    files = [data for data in _config_files(argv, Path(command.cwd)) if isinstance(data, dict)]
    flag = argv[argv.index("--mixed_precision") + 1] if "--mixed_precision" in argv[:-1] else None
    found = _mixed(flag) or next(
        (_mixed(data.get("mixed_precision")) for data in files if "mixed_precision" in data), None
    )
    return found or "fp32"
