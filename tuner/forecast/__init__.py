"""What dstune predicts before it measures, and learns from what it measured: the memory safety margin
(``calibration``), the throughput model's fitted factors (``throughput_fit``), feasible configs ranked by predicted
throughput for warm starts and recommendations (``warm_start``), the recommender's layouts compared and why one wins
(``layouts``), why a config cannot fit, in words for people
(``reasons``), and the longest sequence that fits, with the layout and config that reach it (``longest``, over
``seq_candidates`` and ``seq_scaling``).

The study, the recommender, the API and the dashboard all read these; import from here, not from the modules.

May import: :mod:`tuner.workload`, :mod:`tuner.estimator`, :mod:`tuner.space`. Stores are passed in (duck-typed), so
no SQL here; no Optuna, Ray or torch.
"""

from tuner.forecast.calibration import DEFAULT_MARGIN, MIN_MARGIN, Calibration, allocated_part
from tuner.forecast.command_order import largest_micro_first
from tuner.forecast.layouts import (
    PREDICTION_TIE,
    Judged,
    LayoutChoice,
    compare_layouts,
    judge_grid,
    simplest,
    simplicity,
)
from tuner.forecast.longest import SEARCH_CAP, Fits, LongestFit, NextLimit, NoLengthFits, longest_fit, modelled
from tuner.forecast.reasons import (
    PruneReason,
    ReasonGroup,
    describe_reason,
    group_counts,
    group_reasons,
    memory_reason,
    reason_key,
)
from tuner.forecast.seq_candidates import SEQ_MULTIPLE, Candidate, Pins
from tuner.forecast.seq_scaling import TRACE_LENGTHS, SeqSizer
from tuner.forecast.throughput_fit import (
    FAMILY_PREFIX,
    PredictionAccuracy,
    ThroughputFit,
    load_fit,
    prediction_accuracy,
    record_run,
    spearman,
    throughput_summary,
)
from tuner.forecast.warm_start import (
    COARSE,
    Ranked,
    ThroughputGuide,
    grid_suggestions,
    params_of,
    rank_feasible,
    recheck_earlier,
)

__all__ = [
    "COARSE",
    "DEFAULT_MARGIN",
    "FAMILY_PREFIX",
    "MIN_MARGIN",
    "PREDICTION_TIE",
    "SEARCH_CAP",
    "SEQ_MULTIPLE",
    "TRACE_LENGTHS",
    "Calibration",
    "Candidate",
    "Fits",
    "Judged",
    "LayoutChoice",
    "LongestFit",
    "NextLimit",
    "NoLengthFits",
    "Pins",
    "PredictionAccuracy",
    "PruneReason",
    "Ranked",
    "ReasonGroup",
    "SeqSizer",
    "ThroughputFit",
    "ThroughputGuide",
    "allocated_part",
    "compare_layouts",
    "describe_reason",
    "grid_suggestions",
    "group_counts",
    "group_reasons",
    "judge_grid",
    "largest_micro_first",
    "load_fit",
    "longest_fit",
    "memory_reason",
    "modelled",
    "params_of",
    "prediction_accuracy",
    "rank_feasible",
    "reason_key",
    "recheck_earlier",
    "record_run",
    "simplest",
    "simplicity",
    "spearman",
    "throughput_summary",
]
