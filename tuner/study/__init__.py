"""The study: the tuning loop (ask, estimate, prune or dispatch, record, tell; resumable) and its samplers. The
loop (``loop``) ties the proposer (``proposer``: retries, warm start, the sampler), the gate (``gate``: recorded
before? fits?), the stopper (``stopper``: budget, timeout, early stop), the recorder (``outcome``: record and tell,
with ``numerics_guard`` judging each run's step-0 figures against the study's reference) and the holding of trials
across processes (``resume``). ``length_search`` and ``length_runs`` find the longest sequence that fits by
measurement (``dstune tune --seq-len max``): the estimator's answer bracketed and bisected with measured runs, each
length recorded in a study of its own. ``confirm`` runs a study's winner once more and records that independent run
beside it; ``facts`` reads what every face says beside a measured config; ``memory_bound`` prunes, in a
training command's study, the configs that need at least as much memory as
one that ran out of it. It measures through :class:`Measurer`, which the real dispatcher satisfies;
what it predicts and learns (the memory margin, the throughput fit, the warm start, prune
reasons) comes from :mod:`tuner.forecast`.

May import: :mod:`tuner.forecast`, :mod:`tuner.measure` (its Measurement, MeasureOptions and what a run refuses;
runs go through :class:`Measurer`), :mod:`tuner.requests` (names), :mod:`tuner.storage`, :mod:`tuner.space`,
:mod:`tuner.estimator`, :mod:`tuner.workload`, Optuna.
"""

from tuner.study.confirm import Confirmation, confirm_best, confirmation_options, recorded_confirmation
from tuner.study.early_stop import SlowRunStopper
from tuner.study.facts import AnswerFacts, NumericsFacts, answer_facts, numerics_facts
from tuner.study.gate import capacity_reason
from tuner.study.length_runs import LengthRuns, Measured, default_base_name, length_study_name, longest_name_fits
from tuner.study.length_search import LengthSearch, Probe, search_length
from tuner.study.loop import TuningStudy
from tuner.study.measurer import Measurer
from tuner.study.outcome import measured_over
from tuner.study.samplers import GRID_PARAMETERS, AskTellGridSampler, grid_parameters, make_sampler
from tuner.study.settings import SCRIPT_PATIENCE, Event, StudyReport, StudySettings

__all__ = [
    "GRID_PARAMETERS",
    "SCRIPT_PATIENCE",
    "AnswerFacts",
    "AskTellGridSampler",
    "Confirmation",
    "Event",
    "LengthRuns",
    "LengthSearch",
    "Measured",
    "Measurer",
    "NumericsFacts",
    "Probe",
    "SlowRunStopper",
    "StudyReport",
    "StudySettings",
    "TuningStudy",
    "answer_facts",
    "capacity_reason",
    "confirm_best",
    "confirmation_options",
    "default_base_name",
    "grid_parameters",
    "length_study_name",
    "longest_name_fits",
    "make_sampler",
    "measured_over",
    "numerics_facts",
    "recorded_confirmation",
    "search_length",
]
