"""``seq_len: "max"`` on ``/v1/estimate`` and ``/v1/recommend``: the longest sequence that fits
(:func:`tuner.forecast.longest_fit`), for a workload whose model is traced at :data:`tuner.forecast.TRACE_LENGTHS`
(through the bounded profiling service, as every API workload) and extrapolated.

Blocking (profile service, estimator): the routes call these from their worker thread. Nothing fits: a
:class:`~tuner.requests.FieldError` at ``workload.seq_len`` (422), as a recommendation that finds no config.
"""

from __future__ import annotations

from typing import Any

from tuner.api.schemas import EstimateRequest, LongestWorkloadInput
from tuner.forecast import DEFAULT_MARGIN, TRACE_LENGTHS, LongestFit, NoLengthFits, Pins, longest_fit
from tuner.requests import FieldError, to_workload
from tuner.requests.search_pins import pinned_sections
from tuner.workload import Workload
from tuner.workload.layouts import ULYSSES

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
    """The pins of an estimate body: the fields it sets (AutoTP, AutoEP, hpZ and the numerics fields as their
    ds_config sections, with ``ds_config`` over them, merged over every candidate: :func:`pinned_sections`)."""
    given, work = body.model_fields_set, body.workload
    work_given = work.model_fields_set

    def pinned(name: str) -> Any:
        return getattr(body, name) if name in given else None

    return Pins(
        stage=pinned("stage"),
        offload_optimizer=pinned("offload_optimizer"),
        offload_param=pinned("offload_param"),
        activation_checkpointing=work.activation_checkpointing if "activation_checkpointing" in work_given else None,
        micro_batch=work.micro_batch,
        sp=pinned(ULYSSES.field),
        tiled_mlp_shards=pinned("tiled_mlp_shards"),
        tiled_loss_shards=pinned("tiled_loss_shards"),
        offload_checkpoints=pinned("offload_checkpoints"),
        ds_config=pinned_sections(body),
        nvme_path=body.nvme_path,
    )


def longest(
    workload: Workload, pins: Pins, margin: float = DEFAULT_MARGIN, factors: dict[str, float] | None = None
) -> LongestFit:
    """:func:`longest_fit` with ``margin``, nothing fitting as a 422 at ``workload.seq_len``."""
    try:
        return longest_fit(workload, pins, margin, factors)
    except NoLengthFits as error:
        raise FieldError((*LOC, "seq_len"), str(error)) from None


__all__ = ["asks_max", "estimate_pins", "longest", "traced_workload"]
