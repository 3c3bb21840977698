"""What every face says beside a study's measured config (``dstune best``, ``/v1/recommend``, the dashboard), read
from the stored trial in one place: the choices it makes that change the numerics or the loss's code path, whether
its figures are dstune's trainer's or the user's training command's, and the independent run that confirmed it
(:mod:`tuner.study.confirm`).

Example:
    >>> from tuner.workload import TrialConfig
    >>> facts = numerics_facts(TrialConfig({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
    ...     "bf16_optimizer_states": True}, "zero_optimization": {"stage": 1}}))
    >>> facts.changes_numerics, facts.choices
    (True, ('bf16 master weights and gradients', 'bf16 optimizer states'))
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from tuner.measure.script.answer import script_answer
from tuner.storage.public import public_error
from tuner.study.confirm import Confirmation, recorded_confirmation
from tuner.workload import ConfigError
from tuner.workload.numerics import numerics_notes

if TYPE_CHECKING:
    from tuner.storage import TrialRecord
    from tuner.workload import TrialConfig

MeasuredWith = Literal["trainer", "script"]


@dataclass(frozen=True)
class NumericsFacts:
    """The numerics-changing and code-path choices of a config, in words (empty: fp32-master mixed-precision Adam
    with the model's own loss), and the notes ``dstune best`` prints for them."""

    choices: tuple[str, ...] = ()
    changes_numerics: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class AnswerFacts:
    """What is said beside a measured trial: its numerics choices, who measured its figures, its confirmation."""

    numerics: NumericsFacts = field(default_factory=NumericsFacts)
    measured_with: MeasuredWith = "trainer"
    confirmation: Confirmation | None = None

    def confirmation_dict(self) -> dict[str, Any] | None:
        """The confirmation as an answer shows it: its figures, ``holds`` and its line (None without one)."""
        found = self.confirmation
        return None if found is None else {**found.to_dict(), "holds": found.holds, "line": found.line()}


def numerics_facts(trial: TrialConfig) -> NumericsFacts:
    """The choices ``trial`` makes (:class:`tuner.workload.Numerics`), read leniently: a config whose choices do not
    read says none (it is described elsewhere)."""
    with contextlib.suppress(ConfigError):
        choices = trial.numerics
        return NumericsFacts(tuple(choices.labels()), choices.changes_numerics, tuple(numerics_notes(choices)))
    return NumericsFacts()


def answer_facts(record: TrialRecord) -> AnswerFacts:
    """What the faces say beside the stored trial ``record``; its confirmation's error as open pages show errors
    (:func:`tuner.storage.public.public_error`: one line, no paths or command lines)."""
    script = script_answer((record.measurement or {}).get("script"))
    measured_with: MeasuredWith = "trainer" if script is None else "script"
    confirmation = recorded_confirmation(record)
    if confirmation is not None and confirmation.error:
        confirmation = replace(confirmation, error=public_error(confirmation.error))
    return AnswerFacts(numerics_facts(record.trial), measured_with, confirmation)


__all__ = ["AnswerFacts", "MeasuredWith", "NumericsFacts", "answer_facts", "numerics_facts"]
