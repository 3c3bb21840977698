"""``seq_len: "max"`` on ``/v1/estimate`` and ``/v1/recommend``: the longest sequence that fits
(:func:`tuner.forecast.longest_fit`), for a workload whose model is traced at :data:`tuner.forecast.TRACE_LENGTHS`
(through the bounded profiling service, as every API workload) and extrapolated.

Blocking (profile service, estimator): the routes call these from their worker thread. Nothing fits: a
:class:`~tuner.requests.FieldError` at ``workload.seq_len`` (422), as a recommendation that finds no config.
"""

from __future__ import annotations

from tuner.api.schemas import EstimateRequest, LongestWorkloadInput
from tuner.forecast import TRACE_LENGTHS, Fits, LongestFit, NoLengthFits, Pins, longest_fit
from tuner.requests import FieldError, to_workload
from tuner.workload import Workload

MAX = "max"
LOC = ("workload",)


def asks_max(workload: LongestWorkloadInput) -> bool:
    """Whether the body asks for the longest sequence."""
    return workload.seq_len == MAX


def traced_workload(workload: LongestWorkloadInput) -> Workload:
    """The body's workload with its model's profile at every trace length, traced in one job of the profiling
    service (:class:`FieldError` for bad input; :class:`tuner.profile.service.ProfilePending` while it is computed)."""
    at_longest = workload.model_copy(update={"seq_len": TRACE_LENGTHS[-1]})
    return to_workload(at_longest, LOC, inline=False, lengths=TRACE_LENGTHS)


def estimate_pins(body: EstimateRequest) -> Pins:
    """The pins of an estimate body: the fields it sets (``ds_config`` merged over every candidate)."""
    given, work = body.model_fields_set, body.workload
    work_given = work.model_fields_set
    return Pins(
        stage=body.stage if "stage" in given else None,
        offload_optimizer=body.offload_optimizer if "offload_optimizer" in given else None,
        offload_param=body.offload_param if "offload_param" in given else None,
        activation_checkpointing=work.activation_checkpointing if "activation_checkpointing" in work_given else None,
        micro_batch=work.micro_batch,
        ds_config=body.ds_config,
    )


def longest(
    workload: Workload, pins: Pins, fits: Fits | None = None, factors: dict[str, float] | None = None
) -> LongestFit:
    """:func:`longest_fit`, nothing fitting as a 422 at ``workload.seq_len``."""
    try:
        return longest_fit(workload, pins, fits, factors)
    except NoLengthFits as error:
        raise FieldError((*LOC, "seq_len"), str(error)) from None


__all__ = ["asks_max", "estimate_pins", "longest", "traced_workload"]
