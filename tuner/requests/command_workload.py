"""A queued training command's workload without a model (``dstune queue JOB.json -- <command>`` whose workload names
no ``model``, ``config`` nor ``params``), as ``dstune tune -- <command>`` without ``--model`` has it: the model is
:func:`~tuner.workload.unknown_model`, told apart by the command, so nothing is estimated nor pruned before a run
and the study learns the memory boundary from its runs; tokens/s only where the sequence length is known.

Example:
    >>> from tuner.measure.script.command import ScriptCommand
    >>> request = WorkloadRequest(gpus=2, device="cpu")
    >>> without_model(request), command_workload(request, ScriptCommand(("python", "t.py"), "/w")).model.is_unknown
    (True, True)
"""

from __future__ import annotations

from dataclasses import replace

from tuner.measure.script.command import ScriptCommand
from tuner.requests.workload import FieldError, Loc, WorkloadRequest, to_workload
from tuner.workload import Workload, unknown_model

# the parameter count the cluster, training and launch fields are read with; replaced at once by the unknown model,
# so no estimate of it is ever made or kept
REQUEST_PARAMS = 1e9
MODEL_FIELDS = ("peft", "freeze", "quantization")  # fields that describe the model, meaningless without one


def without_model(request: WorkloadRequest) -> bool:
    """True when the request names no model (``model``, ``config`` nor ``params``)."""
    return all(getattr(request, name) is None for name in ("model", "config", "params"))


def command_workload(request: WorkloadRequest, script: ScriptCommand, loc: Loc = ()) -> Workload:
    """The workload of ``script`` run without a model: the request's cluster, precision, sequence length and launch
    environment, the model unknown; :class:`FieldError` on a field that needs a model (``peft``, ``freeze``,
    ``quantization``)."""
    for name in MODEL_FIELDS:
        if getattr(request, name) is not None:
            raise FieldError(
                (*loc, name),
                "describes the model: give the workload a model too (without one dstune knows nothing of your model)",
            )
    return of_command(to_workload(request.model_copy(update={"params": REQUEST_PARAMS}), loc), script)


def of_command(workload: Workload, script: ScriptCommand) -> Workload:
    """``workload`` (read with :data:`REQUEST_PARAMS`) with its model unknown, told apart by ``script``."""
    return replace(workload, model=unknown_model(script.digest()), profile=None)


def seq_len_known(request: WorkloadRequest) -> bool:
    """Whether tokens per sample are known before the runs: a model, or ``seq_len`` given in the request. Without
    either, tokens/s only where the command's forward saw token ids (samples/s always), as ``dstune tune``."""
    return not without_model(request) or "seq_len" in request.model_fields_set


__all__ = ["MODEL_FIELDS", "REQUEST_PARAMS", "command_workload", "of_command", "seq_len_known", "without_model"]
