"""The flags of a script run or study (``dstune measure|tune [flags] -- <your training command>``): the command,
where its ds_config goes, its batch flags; checked here so that a bad one is one line naming the flag, exit 2."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from typing import Annotated, Any

import click
import typer

from tuner.cli.common import fail
from tuner.cli.max_seq_len import flag_given
from tuner.cli.options import WorkloadFlags
from tuner.errors import InputError
from tuner.measure.script.command import ScriptCommand
from tuner.workload import TrialConfig
from tuner.workload.layouts import LAYOUTS
from tuner.workload.trial import accumulation_for
from tuner.workload.vocabulary import Precision

CommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Your own training command, after --, as you run it (deepspeed/torchrun/accelerate launch/python ...): "
        "measured instead of dstune's trainer, with each trial's ds_config put where it reads its own.",
        show_default=False,
    ),
]
DsConfigAtOpt = Annotated[
    str | None,
    typer.Option(
        help="Where the command reads its ds_config, when dstune cannot find it: a flag (--ds), or a key of "
        "the YAML/JSON config file it names (train.deepspeed, or FILE:KEY)."
    ),
]
ArgMappingOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="The command's own batch flag, in DeepSpeed autotuner's arg_mappings form: "
        "train_micro_batch_size_per_gpu=--batch_size, gradient_accumulation_steps=--accum (repeatable)."
    ),
]
NO_MODEL = (
    "no --model: dstune cannot estimate your command's own model, so it prunes no config before it runs and learns "
    "the memory boundary from the runs (a config that runs out of memory rules out those that need at least as much)"
)
# space parameters a training command decides for itself: dstune's trainer applies them, a script does not
SCRIPT_PINS = {
    "activation_checkpointing": False,
    "tiled_mlp_shards": 1,
    "tiled_loss_shards": 1,
    "offload_checkpoints": False,
    **{kind.field: 1 for kind in LAYOUTS if kind.trainer_applied},
}


def script_command(
    command: list[str] | None, ds_config_at: str | None, arg_mapping: list[str] | None
) -> ScriptCommand | None:
    """The command after ``--`` with its options, its ds_config found and read (exit 2 when it cannot be); None
    without a command (then the options are refused)."""
    if not command:
        if ds_config_at or arg_mapping:
            fail("ds-config-at" if ds_config_at else "arg-mapping", "only with a training command after --")
        return None
    from tuner.measure.script.placement import find_slot, user_config

    try:
        script = ScriptCommand.of(command, os.getcwd(), ds_config_at, arg_mapping)
        user_config(script, find_slot(script))
    except InputError as error:
        fail(error.field, error.message)
    return script


def user_ds_config(script: ScriptCommand) -> dict[str, Any]:
    """The command's own ds_config."""
    from tuner.measure.script.placement import find_slot, user_config

    return user_config(script, find_slot(script))


def script_flags(flags: WorkloadFlags, script: ScriptCommand) -> WorkloadFlags:
    """The workload flags with the precision the command trains in (:func:`script_precision`; ``--precision`` where
    the script builds its config in Python)."""
    precision = script_precision(script)
    return flags if precision is None else replace(flags, precision=precision)


def script_precision(script: ScriptCommand) -> Precision | None:
    """The precision the command's ds_config trains in (its ``bf16``/``fp16`` sections); where HF's ``auto``
    leaves it to the trainer, what the HF Trainer's or accelerate's own arguments on the command fill it with; None
    where the command names no ds_config (its script passes one to ``deepspeed.initialize``: unseen before it runs)."""
    from tuner.measure.script.auto_values import auto_precision
    from tuner.measure.script.placement import find_slot

    if find_slot(script).in_call:
        return None
    config = user_ds_config(script)
    found = [name for name in ("bf16", "fp16") if isinstance(config.get(name), dict) and "enabled" in config[name]]
    values = {name: config[name]["enabled"] for name in found}
    if any(value == "auto" for value in values.values()):
        return auto_precision(script, find_slot(script))
    return "bf16" if values.get("bf16") is True else "fp16" if values.get("fp16") is True else "fp32"


def script_trial(script: ScriptCommand, flags: WorkloadFlags, world: int) -> TrialConfig:
    """The command's own ds_config as one trial (``dstune measure``): batch keys it leaves to ``auto`` (or out)
    filled from ``--micro-batch`` and ``--grad-accum`` when given, else from the command's own batch flags (the HF
    Trainer's ``--per_device_train_batch_size 2``), else those flags' defaults."""
    from tuner.measure.script.placement import command_batch, find_slot

    config = dict(user_ds_config(script))
    own = command_batch(script, find_slot(script), config)
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps")
    total = config.get("train_batch_size")
    if not isinstance(micro, int):
        micro = _given_or(flags.micro_batch, "micro_batch", own.get("train_micro_batch_size_per_gpu"))
    if not isinstance(accum, int):
        own_accum = _given_or(flags.grad_accum, "grad_accum", own.get("gradient_accumulation_steps"))
        accum = accumulation_for(total, micro, world) if isinstance(total, int) else own_accum
    config.update(
        train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum, train_batch_size=micro * accum * world
    )
    return TrialConfig(config)


def _given_or(value: int, name: str, command_value: int | None) -> int:
    """``value`` of the flag ``name`` when the user gave it on dstune's command line, else the command's own."""
    context = click.get_current_context(silent=True)
    given = context is not None and flag_given(context, name)  # type: ignore[arg-type]
    return value if given or command_value is None else command_value


def script_pins(space: str) -> list[str]:
    """``--pin`` items fixing what a training command decides for itself (:data:`SCRIPT_PINS`), for the parameters
    the space ``space`` has."""
    return [f"{name}={value}" for name, value in script_pin_values(space).items()]


def script_pin_values(space: str) -> dict[str, Any]:
    """:data:`SCRIPT_PINS` for the parameters the space ``space`` has."""
    from tuner.space import SpaceError, load_space, resolve_space

    try:
        names = load_space(resolve_space(space)).names
    except SpaceError as error:
        fail("space", str(error))
    return {name: value for name, value in SCRIPT_PINS.items() if name in names}


def script_study_name(default: str, script: ScriptCommand) -> str:
    """A script study's default name: the workload's, marked with the command (a built-in study of the same
    workload keeps its own)."""
    digest = hashlib.sha1(" ".join(script.argv).encode()).hexdigest()[:8]
    return f"{default}-script-{digest}"
