"""A script study's answer: the ds_config the command trained with and the command with it filled in, from what a
measurement recorded (``Measurement.script``), for ``dstune best``, the HF export, the dashboard and the API."""

from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import Any

from tuner.measure.script.code_paths import code_paths_line
from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.placement import ConfigSlot, filled

FIGURES_NOTE = "the figures are your training command's, measured with its own model, data and loss"
# where an open page or answer points instead of showing the command (it may hold paths, or a token passed as a flag)
COMMAND_HINT = "dstune best --study <study> prints your command with this config in it"


def answer_record(
    script: ScriptCommand, slot: ConfigSlot, targets: dict[str, str], config: dict[str, Any]
) -> dict[str, Any]:
    """What a measurement keeps to answer later: the command, where its config went and the config itself."""
    return {
        "backend": "script",
        "command": script.display(),
        "argv": list(script.argv),
        "ds_config_at": slot.source,
        "slot": asdict(slot),
        "targets": dict(targets),
        "ds_config": config,
    }


def public_answer(answer: dict[str, Any] | None) -> dict[str, Any] | None:
    """:func:`script_answer`'s answer for an open page: the command left out, a pointer to it instead."""
    if answer is None:
        return None
    return {**answer, "command": None, "config_file_edits": None, "note": f"{answer['note']} ({COMMAND_HINT})"}


def script_answer(recorded: dict[str, Any] | None, out: str = "ds_config.json") -> dict[str, Any] | None:
    """The winning ds_config and the command with it filled in (the config written to ``out``); None when the
    measurement was not a training command's.

    >>> answer = script_answer({"backend": "script", "argv": ["deepspeed", "t.py", "--deepspeed_config", "a.json"],
    ...     "slot": {"index": 3, "key": None, "source": "--deepspeed_config", "hf": False}, "targets": {},
    ...     "ds_config": {"train_batch_size": 8}})
    >>> answer["command"]
    'deepspeed t.py --deepspeed_config ds_config.json'
    """
    if not recorded or recorded.get("backend") != "script" or "argv" not in recorded:
        return None
    slot = ConfigSlot(**recorded["slot"])
    argv, edits = filled(tuple(recorded["argv"]), slot, recorded.get("targets", {}), recorded["ds_config"], out)
    file_note = None
    if slot.in_call:
        file_note = "your script passes its own config to deepspeed.initialize: set these keys in it (merged over it)"
    if edits:
        where = argv[slot.index]
        file_note = f"in {where} set " + ", ".join(f"{key}: {value}" for key, value in edits.items())
    return {
        "ds_config": recorded["ds_config"],
        "command": shlex.join(argv),
        "config_file_edits": file_note,
        "note": FIGURES_NOTE,
        "code_paths": code_paths_line(recorded.get("code_paths")),  # its chunked loss and Liger's kernels, or not
    }
