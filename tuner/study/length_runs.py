"""One measured length of ``dstune tune --seq-len max``: the estimator's config at that length, run, judged and
recorded (:class:`LengthRuns`, the measuring callable :func:`tuner.study.length_search.search_length` calls).

Each length is a workload of its own (the sequence length is part of a workload's fingerprint), so each is recorded
in a study of its own, ``NAME:LENGTH`` (:func:`length_study_name`), holding that length's one config: ``dstune best
--study NAME:LENGTH`` exports it, the dashboard lists it. A run that trains with its measured peak within the memory
(``--gpu-memory``) fits; one out of memory, or whose peak exceeds the memory (recorded ``oom`` with both figures, as
the study's recorder does: :func:`tuner.study.outcome.measured_over`), does not; anything else (an error, a timeout, a
refusal) says nothing about memory. Running the same search again reuses what each length's study recorded (``ok``
and ``oom`` are answers; a failed, stale or timed-out run is measured again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.estimator import MemoryEstimate, estimate
from tuner.forecast import Candidate, Pins, SeqSizer
from tuner.measure.long_context_checks import measured_refusal
from tuner.measure.measurement import Measurement
from tuner.requests import is_study_name
from tuner.storage import Store, StudyStatus, TrialRecord, process_owner
from tuner.study.length_search import Probe, Verdict
from tuner.study.measurer import Measurer
from tuner.study.outcome import measured_over
from tuner.workload import TrialConfig, Workload, config_key, workload_to_dict

SAMPLER = "seq-len-max"  # what the length studies record as their sampler: no sampler proposes their config
ANSWERS: dict[str, Verdict] = {"ok": "fits", "oom": "over"}  # recorded statuses that answer a length


def length_study_name(base: str, seq_len: int) -> str:
    """The study one length is recorded in: ``NAME:LENGTH``.

    >>> length_study_name("tiny", 4096)
    'tiny:4096'
    """
    return f"{base}:{seq_len}"


def longest_name_fits(base: str, cap: int) -> bool:
    """Whether every length study of ``base`` up to ``cap`` tokens has a name the study-name rule accepts."""
    return is_study_name(length_study_name(base, cap))


def default_base_name(workload: Workload) -> str:
    """``<model>-seqmax-<fingerprint of the workload without its length>``: a search's name when none is given."""
    payload = workload_to_dict(workload)
    payload["model"].pop("name", None)
    payload["train"].pop("seq_len", None)
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:8]
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in workload.model.name)[:48].lstrip("._-")
    return f"{name or 'model'}-seqmax-{digest}"


@dataclass(frozen=True)
class Measured:
    """What a length's probe shows: its config, the estimate and what the run measured (peak, tokens/s)."""

    trial: TrialConfig
    estimate: MemoryEstimate
    study: str
    status: str
    peak: int | None
    tokens_per_s: float | None
    reused: bool

    def to_details(self) -> dict[str, Any]:
        return dict(self.__dict__)


class LengthRuns:
    """Measures ``candidate`` at the lengths asked, recording each in its length's study (module docstring).

    ``sizer`` gives the workload at each length, ``measurer`` runs it (the dispatcher, or a fake), ``on_probe`` is
    told each probe as it is measured (progress displays)."""

    def __init__(
        self,
        store: Store,
        base: str,
        sizer: SeqSizer,
        candidate: Candidate,
        pins: Pins,
        measurer: Measurer,
        on_probe: Callable[[Probe], None] | None = None,
    ) -> None:
        self.store, self.base, self.sizer, self.candidate, self.pins = store, base, sizer, candidate, pins
        self.measurer, self.on_probe = measurer, on_probe or (lambda probe: None)
        self.owner = process_owner()

    def config_at(self, seq_len: int) -> tuple[Workload, TrialConfig]:
        """The workload and the candidate's trial config at ``seq_len`` tokens."""
        work = self.sizer.at(seq_len)
        return work, self.candidate.trial(work, seq_len, self.pins)

    def __call__(self, seq_len: int) -> Probe:
        work, trial = self.config_at(seq_len)
        est = estimate(work, trial)
        refusal = measured_refusal(work, trial, work.cluster.device)
        if refusal is not None:
            probe = Probe(seq_len, "failed", f"{refusal[0]}: {refusal[1]}")
        else:
            probe = self._measured(work, trial, est)
        self.on_probe(probe)
        return probe

    def _measured(self, work: Workload, trial: TrialConfig, est: MemoryEstimate) -> Probe:
        seq_len = work.train.seq_len
        name = length_study_name(self.base, seq_len)
        settings = {"seq_len_search": self.base, "seq_len": seq_len, "candidate": self.candidate.to_dict()}
        study = self.store.get_or_create_study(name, self.store.upsert_workload(work), SAMPLER, settings)
        key = config_key(trial)
        record = self._ready(study.id, key, trial, est)
        if record.status in ANSWERS or record.status not in ("pending", "failed", "error", "timeout"):
            return _probe(seq_len, record, trial, est, name, reused=True)
        self.store.set_study_status(study.id, StudyStatus.RUNNING)
        self.store.start_trial(record.id, hardware=work.cluster.hardware_key, owner=self.owner)
        try:
            measurement = self.measurer.submit(work, trial).result()
        except KeyboardInterrupt:  # recorded failed (the same command measures it again), then the search stops
            self.store.finish_trial(record.id, "failed", None, error="interrupted by the user")
            self.store.set_study_status(study.id, StudyStatus.INTERRUPTED)
            raise
        except Exception as failure:  # the dispatcher itself failed (Ray unreachable...): recorded, never lost
            measurement = Measurement(status="error", exception_type=type(failure).__name__, error=str(failure))
        status, error = _judged(measurement, work.cluster.gpu_memory)
        finished = self.store.finish_trial(record.id, status, measurement.to_dict(), error=error)
        self.store.set_study_status(study.id, StudyStatus.FINISHED)
        return _probe(seq_len, finished, trial, est, name, reused=False)

    def _ready(self, study_id: int, key: str, trial: TrialConfig, est: MemoryEstimate) -> TrialRecord:
        """The length's record of this config: recorded before (a run a killed process left running is failed
        first, and a failure made pending again), or new and pending."""
        self.store.mark_stale_running_failed(study_id)
        found = self.store.find_trial_by_key(study_id, key)
        if found is None:
            trial_id = self.store.add_trial(
                study_id, 0, key, trial.ds_config, None, trial.activation_checkpointing, est.to_dict(), "pending"
            )
            return self.store.get_trial(trial_id)
        if found.status in ("failed", "error", "timeout"):
            return self.store.retry_trial(found.id, found.number + 1)
        return found


def _judged(measurement: Measurement, gpu_memory: int) -> tuple[str, str | None]:
    """The status to record and why: a run that trained with its peak above the memory is ``oom``."""
    if measurement.status != "ok":
        return measurement.status, measurement.error
    peak = max((b for b in measurement.peak_bytes_per_rank if b is not None), default=None)
    over = measured_over(peak, gpu_memory)
    return ("oom", over) if over else ("ok", None)


def _probe(
    seq_len: int, record: TrialRecord, trial: TrialConfig, est: MemoryEstimate, study: str, reused: bool
) -> Probe:
    verdict = ANSWERS.get(record.status, "failed")
    note = "" if verdict == "fits" else f"{record.status}: {record.error or ''}".strip().rstrip(":")
    shown = Measured(trial, est, study, record.status, record.peak_bytes, record.tokens_per_s, reused)
    return Probe(seq_len, verdict, note, shown.to_details())


__all__ = ["SAMPLER", "LengthRuns", "Measured", "default_base_name", "length_study_name", "longest_name_fits"]
