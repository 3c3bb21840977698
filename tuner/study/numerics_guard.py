"""The numerics guard: a measured run whose step-0 loss or global gradient norm differs from the study's reference
beyond its precision's tolerance is ``diverged`` (pure logic; the figures come from
:func:`tuner.measure.rank.numerics.first_step_numerics`).

Which runs are compared. Every run of a study trains on the same seeded global batch, whatever its micro-batch,
accumulation and layout (:mod:`tuner.measure.rank.numerics`), so step 0 must agree between any two configs with the same
global batch and the same initial weights. The reference is a plain data-parallel run (no sequence, tensor or expert
parallelism; the fault switch off): the first such ``ok`` run of the study with the same :func:`reference_class`,
measured before the run it judges. Runs are grouped by

* the global batch (a study fixes it; a config that changes it is a different optimisation problem),
* the precision (a workload's; the tolerance is the precision's), and
* the model's birth: ZeRO-3 builds the model partitioned (``deepspeed.zero.Init``), which draws the built-in model's
  initial weights differently from stages 0-2 (measured on the tiny GPT: step-0 loss +0.37 %, gradient norm +6 %,
  ``bench/results/numerics_noise.md``), so ZeRO-3 runs have a ZeRO-3 reference.

A run measured while its class has no reference yet is recorded ``ok`` and ``unchecked``; the first plain one becomes
the reference. Runs with quantized collectives (CUDA only) are compared like the rest.

Runs measured before step 0 held the model's dropout (their numerics lack ``step0_dropout_held``: a study
resumed from then) form classes of their own.

Tolerances are relative, per precision (:data:`TOLERANCES`), set from the noise measured between equivalent configs
(ZeRO-0/1/2, micro-batch × accumulation splits 2 × 2, 4 × 1, 1 × 4 of one global batch, tiny GPT on 2 gloo ranks):
the gradient norm within 2.7e-7 in fp32 and 2.5e-5 in bf16, the loss within 3.4e-8; fp32's 1e-4 and bf16's 2e-2
sit hundreds of times above that and far below a factor 2. They hold for any split because step 0 does not depend
on it: every rank holds the model's dropout for step 0 (:mod:`tuner.measure.rank.dropout_hold`). Dropout draws its
masks per micro-batch call, so with it on another split trains through other masks: on the README's LoRA example
(``lora_dropout`` 0.05) the norm moved 2.0-2.5e-2 between the 4 × 1, 2 × 2 and 1 × 4 splits, in fp32 as in bf16, and
micro 1 × 4 was called diverged; held, the splits agree within 1.4e-4 in bf16 and exactly in fp32
(``bench/results/numerics_noise_tiny-llama_lora.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.workload import TrialConfig
from tuner.workload.layouts import AUTOEP

# relative tolerance on the step-0 loss and gradient norm, by training precision (bench/results/numerics_noise.md)
TOLERANCES = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
LOSS, NORM = "step0_loss", "step0_grad_norm"
HELD = "step0_dropout_held"  # the rank held the model's dropout for step 0 (how many sites)


def reference_class(trial: TrialConfig, world_size: int) -> tuple[int, str, str]:
    """What a run is compared within: its global batch, its precision and how the model is born (``zero3`` or
    ``whole``).

    >>> reference_class(TrialConfig({"train_batch_size": 8, "zero_optimization": {"stage": 3}}), 2)
    (8, 'fp32', 'zero3')
    """
    return trial.global_batch(world_size), trial.precision, "zero3" if trial.stage == 3 else "whole"


def can_be_reference(trial: TrialConfig, numerics: Mapping[str, Any]) -> bool:
    """A plain data-parallel run with the fault switch off and a step-0 loss.

    >>> can_be_reference(TrialConfig({}), {"step0_loss": 7.0})
    True
    >>> can_be_reference(TrialConfig({"sequence_parallel_size": 2}), {"step0_loss": 7.0})
    False
    >>> can_be_reference(TrialConfig({"expert_parallel": {"enabled": True, "autoep_size": 2}}), {"step0_loss": 7.0})
    False
    """
    layout = trial.layout
    plain = layout.model_parallel == 1 and layout.degree(AUTOEP) == 1 and not trial.numerics.changes_numerics
    return plain and trial.fault_loss_scale == 1.0 and numerics.get(LOSS) is not None


def relative(value: float | None, reference: float | None) -> float | None:
    """|value − reference| / |reference| (None without both; infinite against a zero reference that differs).

    >>> relative(0.5, 1.0), relative(None, 1.0), relative(1.0, 0.0)
    (0.5, None, inf)
    """
    if value is None or reference is None:
        return None
    if reference == 0:
        return 0.0 if value == 0 else float("inf")
    return abs(value - reference) / abs(reference)


@dataclass(frozen=True)
class Verdict:
    """A run's numerics against its reference: ``diverged`` or not, the relative differences and the tolerance."""

    diverged: bool
    loss_rel: float | None
    grad_norm_rel: float | None
    tolerance: float

    def reason(self, numerics: Mapping[str, Any], reference: Mapping[str, Any], number: int) -> str:
        """One line with both figures: ``numerics diverged from trial 0: step-0 grad norm 0.6676 vs 1.335 ...``."""
        parts = []
        for key, label, rel in ((LOSS, "loss", self.loss_rel), (NORM, "grad norm", self.grad_norm_rel)):
            if rel is not None and rel > self.tolerance:
                parts.append(f"step-0 {label} {numerics[key]:.6g} vs {reference[key]:.6g} ({rel:.2e} relative)")
        return f"numerics diverged from trial {number}: " + "; ".join(parts) + f" (tolerance {self.tolerance:g})"


def compare(numerics: Mapping[str, Any], reference: Mapping[str, Any], precision: str) -> Verdict:
    """Judge ``numerics`` against ``reference`` at ``precision``'s tolerance (:data:`TOLERANCES`); a figure either
    side lacks (DeepSpeed computed no gradient norm) is not compared. NaN differs from everything.

    >>> compare({LOSS: 7.0, NORM: 0.5}, {LOSS: 7.0, NORM: 1.0}, "bf16").diverged
    True
    >>> compare({LOSS: 7.0001, NORM: 1.001}, {LOSS: 7.0, NORM: 1.0}, "bf16").diverged
    False
    """
    tolerance = TOLERANCES.get(precision, TOLERANCES["bf16"])
    loss_rel = relative(numerics.get(LOSS), reference.get(LOSS))
    norm_rel = relative(numerics.get(NORM), reference.get(NORM))
    diverged = any(rel is not None and not rel <= tolerance for rel in (loss_rel, norm_rel))
    return Verdict(diverged, loss_rel, norm_rel, tolerance)


def changed_numerics(trial: TrialConfig, verdict: Verdict, numerics: dict[str, Any]) -> Verdict:
    """A run whose config changes the numerics (bf16 master weights and optimizer states, Muon: never a reference)
    against the fp32-master Adam reference: its choices are recorded beside the differences (``numerics["changes"]``),
    and the differences within the precision's tolerance are what bf16 explains. Step 0's loss comes before any
    update, so it is judged as any run's; under Muon DeepSpeed's gradient norm is the norm of Muon's orthogonalised
    update for the matrices, not of the gradient, so it is reported and not judged.

    >>> trial = TrialConfig({"bf16": {"enabled": True}, "optimizer": {"type": "Muon"},
    ...                      "zero_optimization": {"stage": 1}})
    >>> figures = {}
    >>> changed_numerics(trial, Verdict(True, 0.0, 3.0, 0.02), figures).diverged, figures["changes"]
    (False, ['Muon optimizer'])
    """
    if not trial.numerics.changes_numerics:
        return verdict
    numerics["changes"] = [label for label in trial.numerics.labels() if label != "chunked cross-entropy loss"]
    if not trial.numerics.muon:
        return verdict
    loss_diverged = verdict.loss_rel is not None and not verdict.loss_rel <= verdict.tolerance
    return Verdict(loss_diverged, verdict.loss_rel, verdict.grad_norm_rel, verdict.tolerance)


@dataclass
class Reference:
    """A class's reference run: its trial number and numerics."""

    number: int
    numerics: dict[str, Any]


class NumericsGuard:
    """The study's references, one per :func:`reference_class`, and the verdict on each measured run."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.references: dict[tuple[int, str, str, bool], Reference] = {}

    def key(self, trial: TrialConfig, numerics: Mapping[str, Any]) -> tuple[int, str, str, bool]:
        """The run's :func:`reference_class` and whether its step 0 held the dropout (runs recorded before did not)."""
        return (*reference_class(trial, self.world_size), HELD in numerics)

    def learn(self, number: int, trial: TrialConfig, numerics: Mapping[str, Any]) -> bool:
        """Take a recorded ok run as its class's reference if it can be one and the class has none (runs are
        offered in trial order); True when it became the reference."""
        key = self.key(trial, numerics)
        if key in self.references or not can_be_reference(trial, numerics):
            return False
        self.references[key] = Reference(number, dict(numerics))
        return True

    def judge(self, number: int, trial: TrialConfig, numerics: dict[str, Any]) -> str | None:
        """Judge an ok run's ``numerics`` (annotated in place: ``check`` is ``reference``, ``ok``, ``diverged`` or
        ``unchecked``, with the reference's figures and the relative differences); the reason if it diverged."""
        if numerics.get(LOSS) is None:
            numerics["check"] = "unchecked"
            return None
        reference = self.references.get(self.key(trial, numerics))
        if reference is None:
            numerics["check"] = "reference" if self.learn(number, trial, numerics) else "unchecked"
            return None
        verdict = compare(numerics, reference.numerics, trial.precision)
        verdict = changed_numerics(trial, verdict, numerics)
        numerics.update(
            check="diverged" if verdict.diverged else "ok",
            reference={
                "trial": reference.number,
                LOSS: reference.numerics.get(LOSS),
                NORM: reference.numerics.get(NORM),
            },
            loss_rel=verdict.loss_rel,
            grad_norm_rel=verdict.grad_norm_rel,
            tolerance=verdict.tolerance,
        )
        return verdict.reason(numerics, reference.numerics, reference.number) if verdict.diverged else None
