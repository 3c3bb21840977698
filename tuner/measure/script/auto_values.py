"""What a command's ``"auto"`` precision becomes: the HF Trainer fills an ``auto`` ``bf16``/``fp16`` section from its
own ``--bf16``/``--fp16`` arguments (or those keys of a framework's config file; TRL's configs default ``bf16`` to
true), accelerate from its ``--mixed_precision`` (a flag of ``accelerate launch``, or its config file's key); none set
trains in fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.placement import CONFIG_SUFFIXES, ConfigSlot, _load, split_equals
from tuner.workload.vocabulary import Precision

TRUE = frozenset({"true", "1", "yes", "y", "t"})  # HfArgumentParser's string_to_bool; a bare --bf16 is true too


def _hf_flag(argv: tuple[str, ...], name: str) -> bool | None:
    """``--name`` as HfArgumentParser reads a bool field (``--bf16``, ``--bf16 True``); None when not given."""
    flag = f"--{name}"
    if flag not in argv:
        return None
    index = argv.index(flag) + 1
    return index == len(argv) or argv[index].startswith("-") or argv[index].lower() in TRUE


def _trl(argv: tuple[str, ...], cwd: Path) -> bool:
    """Whether the command runs TRL (its ``trl`` CLI, or a script that imports it), whose configs train in bf16 unless
    told otherwise (``bf16`` defaults to true where ``fp16`` is not set)."""
    if Path(argv[0]).name == "trl":
        return True
    for arg in argv:
        path = cwd / arg
        if arg.endswith(".py") and path.is_file():
            text = path.read_text(errors="replace")
            if "from trl" in text or "import trl" in text:
                return True
    return False


def _hf_precision(bf16: bool | None, fp16: bool | None, trl: bool) -> Precision:
    if bf16 or (bf16 is None and trl and not fp16):
        return "bf16"
    return "fp16" if fp16 else "fp32"


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
    argv, cwd = split_equals(command.argv), Path(command.cwd)
    if slot.hf and slot.key is None:
        return _hf_precision(_hf_flag(argv, "bf16"), _hf_flag(argv, "fp16"), _trl(argv, cwd))
    if slot.hf:  # a framework's config file holds the Trainer's arguments (flags given beside it win)
        data = _load(cwd / argv[slot.index])
        bf16, fp16 = (_hf_flag(argv, name) for name in ("bf16", "fp16"))
        bf16 = data.get("bf16") if bf16 is None else bf16
        return _hf_precision(bf16, data.get("fp16") if fp16 is None else fp16, _trl(argv, cwd))
    files = [data for data in _config_files(argv, Path(command.cwd)) if isinstance(data, dict)]
    flag = argv[argv.index("--mixed_precision") + 1] if "--mixed_precision" in argv[:-1] else None
    found = _mixed(flag) or next(
        (_mixed(data.get("mixed_precision")) for data in files if "mixed_precision" in data), None
    )
    return found or "fp32"
