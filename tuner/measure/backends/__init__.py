"""Measuring backends: what "measure one trial" means, behind one small protocol and one registry.

A backend takes a workload and a trial config (the spec) and returns a
:class:`~tuner.measure.measurement.Measurement`, its runs started by one of the launchers
(:mod:`tuner.measure.backends.launchers`: processes on this machine, or a Ray cluster). Two backends ship:

- ``builtin`` (:mod:`tuner.measure.backends.builtin`): dstune's own trainer, one rank program per rank;
- ``script`` (:mod:`tuner.measure.backends.script`): the user's own training command, run unchanged with the trial's
  ds_config put where it reads it, measured by a hook dstune adds to its processes (:mod:`tuner.measure.script`).

Adding a third (a framework's own launcher, a Kubeflow TrainJob) is one module with a class that satisfies
:class:`MeasuringBackend` plus one line in :data:`BACKENDS`. Importing this package loads no torch, Ray or DeepSpeed.
"""

from __future__ import annotations

import importlib

from tuner.measure.backends.base import MeasuringBackend, RunControls
from tuner.measure.options import MeasureOptions

# backend name -> "module:Class"; imported when used, so a caller that never measures loads no torch
BACKENDS: dict[str, str] = {
    "builtin": "tuner.measure.backends.builtin:BuiltinTrainer",
    "script": "tuner.measure.backends.script:ScriptBackend",
}


def backend_name(options: MeasureOptions) -> str:
    """The backend that measures runs made with ``options``: ``script`` when a command is given, else ``builtin``.

    >>> from tuner.measure.options import MEASURE_DEFAULTS
    >>> backend_name(MEASURE_DEFAULTS)
    'builtin'
    """
    return "script" if options.script is not None else "builtin"


def backend_for(options: MeasureOptions) -> MeasuringBackend:
    """The backend instance for ``options`` (:data:`BACKENDS`)."""
    module, _, name = BACKENDS[backend_name(options)].partition(":")
    backend: MeasuringBackend = getattr(importlib.import_module(module), name)()
    return backend


__all__ = ["BACKENDS", "MeasuringBackend", "RunControls", "backend_for", "backend_name"]
