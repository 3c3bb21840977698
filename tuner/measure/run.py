"""One measured run for a workload and trial config, through either launcher, with the estimate beside it."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

from tuner.errors import InputError
from tuner.estimator import estimate
from tuner.measure.launcher import launch_local
from tuner.measure.long_context_checks import measured_refusal
from tuner.measure.measurement import Measurement, StepHook
from tuner.measure.options import MEASURE_DEFAULTS, MeasureOptions
from tuner.measure.rank_place import port_taken
from tuner.measure.run_protocol import RunSpec
from tuner.workload import MEASURED_QUANTIZATION, TrialConfig, Workload, workload_to_dict


def run_measurement(
    workload: Workload,
    trial: TrialConfig,
    options: MeasureOptions = MEASURE_DEFAULTS,
    *,
    progress: Any = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
    profiler_overhead: bool = False,
    extra: dict[str, Any] | None = None,
) -> Measurement:
    """Run ``trial`` on ``workload`` (its cluster's device and world size, its model as its ``ModelSpec`` says:
    transformers' built from its config, or the built-in one) as ``options`` say, and return the measurement.
    Setting ``cancel`` kills the run's ranks at once (the measurement is then ``error`` / ``Cancelled``);
    ``on_step`` may stop a run early (:func:`tuner.measure.launcher.launch_local`). ``profiler_overhead`` times one
    more step under the true-peak instrument; ``extra`` goes to the ranks as ``RunSpec.extra``
    (``allocation_detail``: what is alive at the peak). A 4-bit bitsandbytes base is refused (:class:`InputError`
    naming ``quantization``): the ranks would train the unquantized model, not the one asked for; so is what a run
    cannot measure of the long-context settings (:func:`~tuner.measure.long_context_checks.measured_refusal`)."""
    if workload.trainable.quantization:
        raise InputError("quantization", MEASURED_QUANTIZATION)
    if options.memory_cap and workload.cluster.device == "cuda":  # RLIMIT_AS breaks cuInit
        raise InputError("memory-cap", "an address-space cap breaks CUDA's initialisation (cuInit): CPU runs only")
    refusal = measured_refusal(workload, trial, workload.cluster.device)
    if refusal is not None:
        raise InputError(*refusal)
    spec = RunSpec(
        workload_to_dict(workload),
        trial.ds_config,
        activation_checkpointing=trial.activation_checkpointing,
        device=workload.cluster.device,
        warmup=options.warmup,
        steps=options.steps,
        warmup_max=options.warmup_max,
        profiler_overhead=profiler_overhead,
        extra=dict(extra or {}),
    )
    launch = dict(timeout=options.timeout, memory_cap=options.memory_cap, progress=progress, cancel=cancel)
    launcher: Any = launch_local
    if options.launcher == "ray":
        from tuner.measure.ray_launcher import launch_ray

        launcher, launch["address"] = launch_ray, options.ray_address
    measurement = launcher(spec, on_step=on_step, **launch)
    if measurement.status == "error" and port_taken(measurement.error or ""):  # free at free_port(), then taken
        measurement = launcher(spec, on_step=on_step, **launch)
    return measurement


def measure(
    workload: Workload,
    trial: TrialConfig,
    options: MeasureOptions = MEASURE_DEFAULTS,
    show_progress: bool = False,
) -> dict:
    """The ``dstune measure --json`` object: the measurement, per-rank details and the estimate."""
    with _progress_bar(show_progress) as bar:
        task = bar.add_task("measuring", total=options.steps) if bar else None

        def report(done: int, total: int) -> None:
            if bar is not None:
                bar.update(task, completed=done, total=total)

        measurement = run_measurement(workload, trial, options, progress=report)
    result = measurement.to_dict()
    result["estimate"] = estimate(workload, trial).to_dict()
    return result


def _progress_bar(show: bool) -> Any:
    if not show:
        return nullcontext(None)
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} timed steps"),
        TimeElapsedColumn(),
        transient=True,
    )
