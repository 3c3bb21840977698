"""The space's two exceptions: a malformed space or pin (:class:`SpaceError`), and trial values that cannot form a
config (:class:`InfeasibleConfig`, an outcome the study prunes, not an error)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.errors import InputError


class SpaceError(InputError):
    """A malformed search space or pin; the message names the file and the key.

    Attributes:
        file: The space file's name (or ``<space>`` for one built in code).
        key: The dotted key at fault, e.g. ``parameters.micro_batch.low`` (empty when the whole file is at fault).
        field: ``file: key`` (or the file alone), what a face names as the field at fault.
    """

    def __init__(self, file: str, key: str, message: str) -> None:
        super().__init__(f"{file}: {key}" if key else file, message)
        self.file = file
        self.key = key


class InfeasibleConfig(Exception):  # an outcome, not an error: the study turns it into a pruned trial
    """The trial's values cannot form a valid config (e.g. a micro-batch that does not divide the global batch).

    The study records the trial as pruned with :attr:`reason`, e.g. ``raise optuna.TrialPruned(str(error))``.

    Attributes:
        reason: Why, in one line.
        params: The parameter values decided so far.
    """

    def __init__(self, reason: str, params: Mapping[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.params = dict(params or {})
