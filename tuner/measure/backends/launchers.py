"""The launchers a backend starts its runs with: ``local`` (processes on this machine) and ``ray`` (a local Ray, or
a cluster by address), chosen by name from one registry instead of string comparisons at each caller.

A launcher answers three questions: how many runs fit at once (:meth:`Launcher.capacity`), how to start the ranks of
dstune's own rank program (:meth:`Launcher.launch_ranks`), and how to run a whole measurement function where a run's
resources are (:meth:`Launcher.call`: here, or inside a Ray task holding the run's CPUs or GPUs), which a backend
that starts its own processes (the user's training command) uses.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from tuner.measure.backends.base import RunControls
from tuner.measure.measurement import Measurement
from tuner.measure.options import MeasureOptions
from tuner.measure.run_protocol import RunSpec


class Launcher(Protocol):
    """Where and how a run's processes start."""

    name: ClassVar[str]
    options: MeasureOptions

    def capacity(self, device: str) -> int:
        """GPUs (``cuda``) or CPUs (``cpu``) the runs may share; connects to Ray up front where it is used, so a bad
        address fails before any trial."""
        ...

    def launch_ranks(self, spec: RunSpec, controls: RunControls) -> Measurement:
        """Run dstune's rank program for ``spec``, one process per rank."""
        ...

    def call(
        self, run: Callable[..., Measurement], args: tuple[Any, ...], world: int, device: str, controls: RunControls
    ) -> Measurement:
        """``run(*args, controls)`` where a run of ``world`` ranks on ``device`` has its resources (on Ray only
        ``controls.cancel`` reaches it)."""
        ...


def _launch_options(options: MeasureOptions, controls: RunControls) -> dict[str, Any]:
    return dict(
        timeout=options.timeout,
        memory_cap=options.memory_cap,
        progress=controls.progress,
        cancel=controls.cancel,
        on_step=controls.on_step,
    )


class _Launcher:
    def __init__(self, options: MeasureOptions) -> None:
        self.options = options


class LocalLauncher(_Launcher):
    """Processes on this machine (:func:`tuner.measure.driver.local_launcher.launch_local`)."""

    name: ClassVar[str] = "local"

    def capacity(self, device: str) -> int:
        if device == "cuda":
            import torch

            return torch.cuda.device_count()
        return os.cpu_count() or 1

    def launch_ranks(self, spec: RunSpec, controls: RunControls) -> Measurement:
        from tuner.measure.driver.local_launcher import launch_local

        return launch_local(spec, **_launch_options(self.options, controls))

    def call(
        self, run: Callable[..., Measurement], args: tuple[Any, ...], world: int, device: str, controls: RunControls
    ) -> Measurement:
        return run(*args, controls)


class RayLauncher(_Launcher):
    """Ray actors placed per node (:func:`tuner.measure.driver.ray_launcher.launch_ray`)."""

    name: ClassVar[str] = "ray"

    def capacity(self, device: str) -> int:
        import ray

        from tuner.measure.driver.ray_launcher import ensure_ray

        ensure_ray(self.options.ray_address)
        return int(ray.cluster_resources().get("GPU" if device == "cuda" else "CPU", 0))

    def launch_ranks(self, spec: RunSpec, controls: RunControls) -> Measurement:
        from tuner.measure.driver.ray_launcher import launch_ray

        return launch_ray(spec, address=self.options.ray_address, **_launch_options(self.options, controls))

    def call(
        self, run: Callable[..., Measurement], args: tuple[Any, ...], world: int, device: str, controls: RunControls
    ) -> Measurement:
        from tuner.measure.driver.ray_call import call_on_ray

        return call_on_ray(run, args, world, device, controls.cancel, self.options.ray_address)


LAUNCHERS: dict[str, type[LocalLauncher] | type[RayLauncher]] = {"local": LocalLauncher, "ray": RayLauncher}


def launcher_for(options: MeasureOptions) -> Launcher:
    """The launcher ``options.launcher`` names.

    >>> from tuner.measure.options import MEASURE_DEFAULTS
    >>> launcher_for(MEASURE_DEFAULTS).name
    'ray'
    """
    return LAUNCHERS[options.launcher](options)
