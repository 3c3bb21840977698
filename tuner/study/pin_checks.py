"""Pins a study refuses at start: a pin overrides the space's conditions on the workload (a ``when:
trainable_params >= ...`` says where a search offers a value, not where it can run), so what decides is whether a
run of the workload can measure the pinned value at all (:func:`tuner.measure.long_context_checks.measured_refusal`:
AutoTP on the built-in model, checkpoint offload or ZeRO++'s quantized communication on CPU ranks...). Such a pin is
a :class:`~tuner.estimator.ConfigError` naming the pin, before the study writes anything, rather than every trial
pruned for it.
"""

from __future__ import annotations

from tuner.estimator import ConfigError
from tuner.measure.long_context_checks import measured_refusal
from tuner.space import SearchSpace
from tuner.space.assemble import assemble
from tuner.space.conditions import same
from tuner.workload import TrialConfig, Workload


def refuse_unmeasurable_pins(space: SearchSpace, workload: Workload) -> None:
    """Raise when the config of the space's pins off their defaults (every other setting at DeepSpeed's default)
    cannot be measured on ``workload``.

    Raises:
        ConfigError: field ``pins.NAME`` (the pin whose key was refused, else the first pin), the value and why.
    """
    pins = {name: value for name, value in space.pins.items() if not same(value, space.parameter(name).default)}
    if not pins:
        return
    config, checkpointing = assemble(space.base, space.parameters, pins, workload.train)
    refusal = measured_refusal(workload, TrialConfig(config, checkpointing), workload.cluster.device)
    if refusal is None:
        return
    key, reason = refusal
    name = next((n for n in pins if space.parameter(n).key == key), next(iter(pins)))
    raise ConfigError(f"pins.{name}", f"pinned to {pins[name]!r}, which no run of this workload measures: {reason}")


__all__ = ["refuse_unmeasurable_pins"]
