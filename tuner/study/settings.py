"""What a study is given (:class:`StudySettings`) and what it says back: an :class:`Event` per trial, for progress
displays, and a :class:`StudyReport` when a run of the loop ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.measure.options import MeasureOptions
from tuner.study.early_stop import SlowRunStopper
from tuner.units import format_bytes
from tuner.workload import Workload

# a training command's runs cost a whole launch each: its study stops once its best stood for this many (--patience)
SCRIPT_PATIENCE = 2
# recorded with a study of a training command's own model (no --model): what it could not do
NO_MODEL_NOTE = "no --model: no config pruned before it ran; the memory boundary learned from the runs"


@dataclass(frozen=True)
class StudySettings:
    """What one study searches and how long."""

    name: str
    workload: Workload
    space_path: Path
    pins: dict[str, Any] = field(default_factory=dict)
    global_batch: int | None = None
    sampler: str = "tpe"
    trials: int = 12
    timeout_s: float | None = None
    pareto: bool = False
    seed: int | None = None
    nvme_path: str | None = None
    thread_budget: int | None = None  # cores per node the ranks' threads may use (--search-threads); None: not searched
    allow_numerics_changes: bool = False  # also search bf16 master weights and states, Muon, the chunked loss
    dispatch: MeasureOptions = field(default_factory=MeasureOptions)
    early_stop: SlowRunStopper | None = field(default_factory=SlowRunStopper)  # None measures every run to the end
    patience: int | None = None  # stop once the best stood for this many measured trials after it; None: never

    def to_record(self) -> dict[str, Any]:
        """The settings stored with the study (JSON-ready)."""
        return {
            "space": str(self.space_path),
            "pins": self.pins,
            "global_batch": self.global_batch,
            "sampler": self.sampler,
            "pareto": self.pareto,
            "seed": self.seed,
            "nvme_path": self.nvme_path,
            "thread_budget": self.thread_budget,
            "allow_numerics_changes": self.allow_numerics_changes,
            "early_stop": None if self.early_stop is None else vars(self.early_stop),
            **({"patience": self.patience} if self.patience else {}),
            **({"script": self.dispatch.script.to_dict()} if self.dispatch.script else {}),
            **({"no_model": NO_MODEL_NOTE} if self.workload.model.is_unknown else {}),
        }


@dataclass
class Event:
    """What just happened to a trial, for progress displays."""

    number: int
    status: str
    tokens_per_s: float | None = None
    reason: str | None = None
    config: str | None = None  # the trial's config in one line (TrialConfig.summary)
    peak_bytes: int | None = None  # the measured peak of its busiest rank

    def line(self) -> str:
        """The event in one line, for logs and output that is not a terminal.

        >>> Event(3, "ok", 11285.4, config="ZeRO-2 · micro 4 × accum 2", peak_bytes=43_201_000).line()
        'trial 3: ok, 11,285 tokens/s, peak 41.2 MiB · ZeRO-2 · micro 4 × accum 2'
        >>> Event(4, "pruned", reason="needs 1.97 GiB of 64.0 MiB", config="ZeRO-0").line()
        'trial 4: pruned · ZeRO-0 · needs 1.97 GiB of 64.0 MiB'
        >>> Event(5, "error", reason="Traceback ...\\n  File x\\nImportError: no fused_adam.so").line()
        'trial 5: error · ImportError: no fused_adam.so'
        """
        head = f"trial {self.number}: {self.status}"
        if self.tokens_per_s:
            head += f", {self.tokens_per_s:,.0f} tokens/s"
        if self.peak_bytes:
            head += f", peak {format_bytes(self.peak_bytes)}"
        last = ((self.reason or "").strip().splitlines() or [""])[-1].strip()  # a traceback's last line says it
        return " · ".join(part for part in (head, self.config, last) if part)


@dataclass
class StudyReport:
    """The outcome of a run of the loop."""

    study_id: int
    interrupted: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    stopped: bool = False
    exhausted: bool = False  # the sampler kept proposing recorded configs: the space has no new ones to offer
    settled: bool = False  # the best stood for ``patience`` measured trials after it: the study stopped asking
