"""One measured run for a workload and trial config, through either launcher, with the estimate beside it."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

from tuner.errors import InputError
from tuner.estimator import estimate
from tuner.measure.measurement import Measurement, StepHook
from tuner.measure.options import MEASURE_DEFAULTS, MeasureOptions
from tuner.workload import TrialConfig, Workload


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
    """Run ``trial`` on ``workload`` (its cluster's device and world size) as ``options`` say, through the measuring
    backend they name (:mod:`tuner.measure.backends`: dstune's own trainer, its model as the ``ModelSpec`` says, or
    the user's own training command), and return the measurement.
    Setting ``cancel`` kills the run's ranks at once (the measurement is then ``error`` / ``Cancelled``);
    ``on_step`` may stop a run early (:func:`tuner.measure.driver.local_launcher.launch_local`). ``profiler_overhead``
    times one more step under the true-peak instrument; ``extra`` goes to the ranks as ``RunSpec.extra``
    (``allocation_detail``: what is alive at the peak). A 4-bit bitsandbytes base is refused (:class:`InputError`
    naming ``quantization``): the ranks would train the unquantized model, not the one asked for; so is what a run
    cannot measure of the long-context settings (:func:`~tuner.measure.long_context_checks.measured_refusal`)."""
    if options.memory_cap and workload.cluster.device == "cuda":  # RLIMIT_AS breaks cuInit
        raise InputError("memory-cap", "an address-space cap breaks CUDA's initialisation (cuInit): CPU runs only")
    from tuner.measure.backends import RunControls, backend_for

    controls = RunControls(progress, cancel, on_step, profiler_overhead, dict(extra or {}))
    return backend_for(options).measure(workload, trial, options, controls)


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
    if options.script is None:
        result["estimate"] = estimate(workload, trial).to_dict()
        return result
    from tuner.measure.script.estimate_note import script_estimate

    result["estimate"], result["estimate_assumes"] = script_estimate(workload, trial)
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
