"""The workload room's input error (:class:`WorkloadError`): every check of a workload, a model config or a preset
raises it, naming the field."""

from __future__ import annotations

from tuner.errors import InputError


class WorkloadError(InputError):
    """Bad workload input; ``field`` names the offending field for error messages."""


__all__ = ["WorkloadError"]
