"""The small protocol every parallel layout implements in the workload room: its degree (the field of
:class:`~tuner.workload.ParallelLayout`, the request field and the search-space parameter share its name), the
ds_config key DeepSpeed reads it from, its label and flag, the ds_config that sets it, and why a workload cannot run a
degree (the space's layout check) and why a trial cannot run its setting (the estimator's check)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from tuner.workload.spec import Workload
from tuner.workload.trial import TrialConfig


class LayoutKind(ABC):
    """One parallel layout, as the rooms above the workload read it (:data:`tuner.workload.layouts.LAYOUTS`)."""

    field: ClassVar[str]  # ParallelLayout's degree field, the request field, the space parameter
    key: ClassVar[str]  # the ds_config key DeepSpeed reads the degree from (dotted)
    label: ClassVar[str]  # in ParallelLayout.label: "TP 2"
    flag: ClassVar[str]  # the CLI flag that pins the degree
    help: ClassVar[str]  # what the degree is, for the flag
    noun: ClassVar[str]  # what the degree is called in a sentence and a response field: "AutoTP degree"
    description: ClassVar[str]  # the request field's description (the API's schema)
    maximum: ClassVar[int]  # the largest degree a request may ask for
    trainer_applied: ClassVar[bool] = False
    """dstune's trainer applies it (Ulysses: it shards each batch over the group), not DeepSpeed from the config
    alone: a training command's study pins it off (the command decides it for itself)."""
    memory_saver: ClassVar[bool] = False
    """Searched among the memory savers the warm start tries when nothing of the coarse grid fits, and left out of
    the recommender's grid (Ulysses: with ALST's pieces in the grid itself an 8B model's grid at 4K tokens on 8 GPUs
    would be 140,000 configs); else a layout of the recommender's grid."""

    @property
    def parameter(self) -> str:
        """The flag's name as a Python parameter (``--hpz``: ``hpz``)."""
        return self.flag.removeprefix("--").replace("-", "_")

    @abstractmethod
    def config(self, degree: int) -> dict[str, Any]:
        """The ds_config that sets ``degree`` (empty for 1, off)."""

    @abstractmethod
    def problem(self, workload: Workload, degree: int) -> str | None:
        """Why ``workload`` cannot run this layout at ``degree`` (None: it can), as the space checks its choices."""

    @abstractmethod
    def check(self, workload: Workload, trial: TrialConfig) -> None:
        """Refuse ``trial``'s setting of this layout on ``workload``, and the combinations with other layouts
        DeepSpeed refuses, as the estimator checks a config.

        Raises:
            ConfigError: naming the key.
        """


__all__ = ["LayoutKind"]
