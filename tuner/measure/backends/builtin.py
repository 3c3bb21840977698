"""The built-in trainer: dstune's own rank program trains the workload's model (transformers' built from its config,
or the built-in one) on synthetic token batches, one process per rank (:mod:`tuner.measure.rank.runner`)."""

from __future__ import annotations

from typing import ClassVar

from tuner.errors import InputError
from tuner.measure.backends.base import RunControls
from tuner.measure.backends.launchers import launcher_for
from tuner.measure.driver.host_memory import run_refusal
from tuner.measure.driver.places import port_taken
from tuner.measure.long_context_checks import measured_refusal
from tuner.measure.measurement import Measurement
from tuner.measure.options import MeasureOptions
from tuner.measure.run_protocol import RunSpec
from tuner.workload import MEASURED_QUANTIZATION, TrialConfig, Workload, workload_to_dict


class BuiltinTrainer:
    """Measures a trial with dstune's own trainer (the backend of every study without a command)."""

    name: ClassVar[str] = "builtin"

    def measure(
        self, workload: Workload, trial: TrialConfig, options: MeasureOptions, controls: RunControls
    ) -> Measurement:
        """One run of the rank program on the launcher ``options`` names. A 4-bit bitsandbytes base is refused
        (:class:`InputError` naming ``quantization``): the ranks would train the unquantized model, not the one asked
        for; so is what a run cannot measure of the long-context settings
        (:func:`~tuner.measure.long_context_checks.measured_refusal`); a run on this host that would not fit its
        memory is not started (``oom``, :mod:`tuner.measure.driver.host_memory`)."""
        if workload.trainable.quantization:
            raise InputError("quantization", MEASURED_QUANTIZATION)
        refusal = measured_refusal(workload, trial, workload.cluster.device)
        if refusal is not None:
            raise InputError(*refusal)
        too_big = run_refusal(
            workload, trial, options
        )  # this host's memory and CPUs (tuner.measure.driver.host_memory)
        if too_big is not None:
            return too_big
        spec = RunSpec(
            workload_to_dict(workload),
            trial.ds_config,
            activation_checkpointing=trial.activation_checkpointing,
            device=workload.cluster.device,
            warmup=options.warmup,
            steps=options.steps,
            warmup_max=options.warmup_max,
            profiler_overhead=controls.profiler_overhead,
            extra=dict(controls.extra),
        )
        launcher = launcher_for(options)
        measurement = launcher.launch_ranks(spec, controls)
        if measurement.status == "error" and port_taken(measurement.error or ""):  # free at free_port(), then taken
            measurement = launcher.launch_ranks(spec, controls)
        return measurement
