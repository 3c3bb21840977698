"""A training command tuned or measured without ``--model`` (``--params``): its own ``nn.Module`` that dstune knows
nothing of. The workload's model is :func:`~tuner.workload.unknown_model`; nothing is estimated, nothing is pruned
before a run, and tokens/s is reported only when the sequence length is known (``--seq-len``, or the token ids the
command's forward saw)."""

from __future__ import annotations

from dataclasses import replace

import click
from rich.console import Console

from tuner.cli.common import fail
from tuner.cli.options import WorkloadFlags, build
from tuner.cli.script_options import NO_MODEL
from tuner.measure.script.command import ScriptCommand
from tuner.requests.command_workload import MODEL_FIELDS, REQUEST_PARAMS, of_command
from tuner.workload import TrialConfig, Workload


def without_model(flags: WorkloadFlags) -> bool:
    """True when neither ``--model`` nor ``--params`` describes the command's model."""
    return flags.model is None and flags.params is None


def command_digest(script: ScriptCommand) -> str:
    """What tells one command's model from another's: its folder and words, hashed.

    >>> command_digest(ScriptCommand(("deepspeed", "train.py"), "/jobs/a"))
    '8fcf770f'
    """
    return script.digest()


def no_model_workload(flags: WorkloadFlags, script: ScriptCommand) -> tuple[Workload, TrialConfig]:
    """The workload (cluster, precision, sequence length, launch environment from the flags; the model unknown,
    told apart by the command) and the shortcut flags' trial; exit 2 on a flag that needs a model (``--peft``,
    ``--freeze``, ``--quantization``)."""
    for name in MODEL_FIELDS:  # each flag is named as its field
        if getattr(flags, name, None) is not None:
            fail(name, "describes the model: give --model too (without it dstune knows nothing of your model)")
    workload, trial = build(replace(flags, params=REQUEST_PARAMS, model=None))
    return of_command(workload, script), trial


def seq_len_known(flags: WorkloadFlags) -> bool:
    """Whether tokens per sample are known before the runs: a model (its workload's ``--seq-len``) or ``--seq-len``
    given on the command line. Without either, tokens/s is reported only where the command's forward saw token ids
    (samples/s always)."""
    if not without_model(flags):
        return True
    context = click.get_current_context(silent=True)
    source = context.get_parameter_source("seq_len") if context is not None else None
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def say_no_model(console: Console | None = None) -> None:
    """Say once, on stderr, that nothing is pruned before it runs."""
    (console or Console(stderr=True)).print(f"note: {NO_MODEL}", highlight=False, soft_wrap=True, markup=False)
