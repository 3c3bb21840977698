"""Pins a study refuses at start: a pin overrides the space's conditions on the workload (a ``when:
trainable_params >= ...`` says where a search offers a value, not where it can run), so what decides is whether the
workload can take the pinned value at all: the layouts' own whole-trial checks (:data:`tuner.workload.layouts.LAYOUTS`:
AutoEP on a dense model, AutoTP with Ulysses, a degree the ranks or heads do not divide) and whether a run of the
workload can measure it (:func:`tuner.measure.long_context_checks.measured_refusal`: AutoTP on the built-in model,
checkpoint offload or ZeRO++'s quantized communication on CPU ranks...). Such a pin is a
:class:`~tuner.estimator.ConfigError` naming the pin, before the study writes anything, rather than every trial
pruned for it.
"""

from __future__ import annotations

from tuner.estimator import ConfigError
from tuner.measure.long_context_checks import measured_refusal
from tuner.space import SearchSpace
from tuner.space.assemble import assemble
from tuner.space.conditions import same
from tuner.space.dsconfig import merge_configs
from tuner.workload import TrialConfig, Workload
from tuner.workload.layouts import LAYOUTS


def refuse_unmeasurable_pins(space: SearchSpace, workload: Workload) -> None:
    """Raise when the config of the space's pins off their defaults (every other setting at DeepSpeed's default)
    cannot run on ``workload`` by the layouts' own checks, or cannot be measured there.

    Raises:
        ConfigError: field ``pins.NAME`` (the pin whose key was refused, else the first pin), the value and why.
    """
    pins = {name: value for name, value in space.pins.items() if not same(value, space.parameter(name).default)}
    if not pins:
        return
    config, checkpointing = assemble(space.base, space.parameters, pins, workload.train)
    for kind in LAYOUTS:  # a pinned degree as DeepSpeed reads it (AutoEP's with its `enabled` beside it)
        pinned = next((p.name for p in space.parameters if p.key == kind.key and p.name in pins), None)
        if pinned is not None and isinstance(pins[pinned], int):
            config = merge_configs(config, kind.config(pins[pinned]))
    trial = TrialConfig(config, checkpointing)
    refusal, what = layout_refusal(workload, trial), "which this workload cannot run"
    if refusal is None:
        refusal, what = (
            measured_refusal(workload, trial, workload.cluster.device),
            "which no run of this workload measures",
        )
    if refusal is None:
        return
    key, reason = refusal
    name = next((n for n in pins if space.parameter(n).key == key), next(iter(pins)))
    raise ConfigError(f"pins.{name}", f"pinned to {pins[name]!r}, {what}: {reason}")


def layout_refusal(workload: Workload, trial: TrialConfig) -> tuple[str, str] | None:
    """The first layout check ``trial`` fails on ``workload`` (each kind's :meth:`~tuner.workload.layouts.LayoutKind.
    check`: its degree against the workload, and the combinations with other layouts DeepSpeed refuses), as the
    refused key and why; None when every kind accepts it."""
    for kind in LAYOUTS:
        try:
            kind.check(workload, trial)
        except ConfigError as error:
            return error.field, error.message
    return None


__all__ = ["layout_refusal", "refuse_unmeasurable_pins"]
