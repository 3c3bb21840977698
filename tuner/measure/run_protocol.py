"""What a launcher and its ranks exchange through a run's folder and environment.

The launcher writes ``RUN_DIR/spec.json`` (a :class:`RunSpec`) and starts each rank with :data:`SPAWNED_AT` set; a
rank leaves its phase timings and launch report (:func:`timings_path`) before its timed steps, appends each timed
step's seconds to its progress file (:func:`progress_path`, read while the run goes on by :func:`read_progress`) and
writes its result (:func:`result_path`, a :class:`tuner.measure.measurement.RankResult`) last, atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.measure.options import MEASURE_DEFAULTS
from tuner.workload import TrialConfig

SPAWNED_AT = "DSTUNE_SPAWNED_AT"  # the launcher's time.monotonic() when it started this rank (the clock is system-wide)
# the launch environment the launcher planned for a rank, applied inside it (tuner.measure.rank.launch_env)
THREADS_VARIABLE = "DSTUNE_THREADS_PER_RANK"
CORES_VARIABLE = "DSTUNE_BIND_CORES"


@dataclass
class RunSpec:
    """Everything a rank needs to run: the workload, the trial config (``ds_config`` and
    ``activation_checkpointing``: :attr:`trial`) and how long to measure (by default as every run is measured:
    :data:`~tuner.measure.options.MEASURE_DEFAULTS`).

    >>> spec = RunSpec({}, {})
    >>> (spec.warmup, spec.steps, spec.warmup_max) == (MEASURE_DEFAULTS.warmup, MEASURE_DEFAULTS.steps, None)
    True
    """

    workload: dict[str, Any]
    ds_config: dict[str, Any]
    activation_checkpointing: bool = False
    device: str = "cpu"
    warmup: int = MEASURE_DEFAULTS.warmup
    steps: int = MEASURE_DEFAULTS.steps
    collective_timeout_s: float = 120.0
    probe_memory: bool = True
    # settle-based warm-up: after ``warmup`` steps, go on until steps settle, up to this many
    warmup_max: int | None = MEASURE_DEFAULTS.warmup_max
    settle_steps: int = 2  # the last this many warm-up steps must agree ...
    settle_tolerance: float = 0.1  # ... within this fraction of their median
    wall_clock_breakdown: bool = True
    lean: bool = True  # skip start-up and shut-down work that measures nothing (:mod:`tuner.measure.rank.lean`)
    true_peak: bool = True  # CPU: record every allocation through the warm-up (:mod:`tuner.measure.rank.true_peak`)
    profiler_overhead: bool = False  # CPU: time one more step under the profiler, after the timed steps
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def trial(self) -> TrialConfig:
        """The trial config this run trains with."""
        return TrialConfig(self.ds_config, self.activation_checkpointing)

    def write(self, run_dir: Path) -> None:
        """Write ``spec.json`` into ``run_dir``."""
        (run_dir / "spec.json").write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, run_dir: Path) -> RunSpec:
        """Read ``spec.json`` from ``run_dir``."""
        return cls(**json.loads((run_dir / "spec.json").read_text()))


def result_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its result."""
    return run_dir / f"rank-{rank}.json"


def progress_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` appends each finished timed step's seconds, one a line (:func:`read_progress`)."""
    return run_dir / f"progress-{rank}"


def timings_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` leaves its phase timings and what it runs with (``{"timings": ..., "launch": ...}``)
    before its timed steps: a run stopped early reports them."""
    return run_dir / f"timings-{rank}.json"


def read_progress(run_dir: Path, rank: int) -> list[float]:
    """The timed step times rank ``rank`` finished so far (complete lines only: a step being written is skipped)."""
    try:
        text = progress_path(run_dir, rank).read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the last piece is empty or a line still being written
    times = []
    for line in lines:
        try:
            times.append(float(line))
        except ValueError:
            break
    return times


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a reader never sees half a file."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)
