"""``POST /v1/estimate``: a workload and a ds_config (or the CLI's shortcut fields) → the estimate by category; with
``workload.seq_len: "max"``, the longest sequence that fits and the estimate of its config there
(:mod:`tuner.api.longest`).

The estimate runs in a worker thread within the request's time budget (:mod:`tuner.api.budget`: 503 past it); a
``seq_len: "max"`` answer is computed once per request and kept, a bounded number at once
(:mod:`tuner.api.long_answers`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from fastapi import APIRouter, Request

from tuner.api.budget import within
from tuner.api.deps import invalid, store_of
from tuner.api.long_answers import answer_once
from tuner.api.longest import asks_max, estimate_pins, longest, traced_workload
from tuner.api.responses import BODY, answers
from tuner.api.schemas import EstimateRequest, EstimateResponse, MaxSeqLenOut
from tuner.estimator import ConfigError, MemoryEstimate, estimate
from tuner.forecast import TRACE_LENGTHS, load_fit, throughput_summary
from tuner.requests import FieldError, Loc, check_request, to_workload, trial_workload
from tuner.workload import TrialConfig, Workload, WorkloadError

router = APIRouter(tags=["estimate"])
T = TypeVar("T")


def checked_estimate(workload: Workload, trial: TrialConfig, loc: Loc = ("ds_config",)) -> MemoryEstimate:
    """:func:`tuner.estimator.estimate`, with a :class:`ConfigError` (or arithmetic on absurd values) as a
    :class:`FieldError` at the config key's path."""
    return _checked(lambda: estimate(workload, trial), loc)


def traced_for(
    workload: Workload, trial: TrialConfig, loc: Loc = ("ds_config",), lengths: tuple[int, ...] = ()
) -> Workload:
    """The workload carrying the activations ``trial`` trains with (at ``lengths`` too), as ``dstune estimate``
    traces them (:func:`tuner.requests.trial_workload`, here by the profiling service); bad input as a
    :class:`FieldError`."""
    try:
        return _checked(lambda: trial_workload(workload, trial, lengths, inline=False), loc)
    except WorkloadError as error:  # the model cannot be checkpointed, or profiled
        field = "activation_checkpointing" if error.field == "activation-checkpointing" else error.field
        raise FieldError(("workload", field), error.message) from None


def _checked(compute: Callable[[], T], loc: Loc) -> T:
    """``compute()``, with a :class:`ConfigError` (or arithmetic on absurd values) as a :class:`FieldError` at the
    config key's path."""
    try:
        return compute()
    except ConfigError as error:
        raise FieldError((*loc, *error.field.split(".")), error.message) from None
    except (TypeError, ValueError, OverflowError, ArithmeticError, KeyError) as error:
        raise FieldError(loc, f"cannot estimate this config: {error}") from None


@router.post(
    "/v1/estimate",
    response_model=EstimateResponse,
    responses=answers(BODY),
)
async def estimate_endpoint(body: EstimateRequest, request: Request) -> EstimateResponse:
    """Estimate peak memory per GPU and per node's CPU, by category, for one workload and ds_config."""
    budget = request.app.state.request_budget_s
    try:
        check_request(body.workload, ("workload",))  # what bounds the cost, on the loop: no thread for hostile input
        if "margin" in body.model_fields_set and not asks_max(body.workload):
            raise FieldError(("margin",), 'only with workload.seq_len "max" (an estimate of one length has none)')
        if asks_max(body.workload):  # computed once, kept, and started only with a free slot
            return await answer_once(request, "estimate", body, lambda: _longest_answer(body, request))
    except FieldError as error:
        raise invalid(error) from None
    return await within(asyncio.to_thread(_answer, body, request), budget)


def _answer(body: EstimateRequest, request: Request) -> EstimateResponse:
    """The estimate (blocking: profile service, estimator, database)."""
    store = store_of(request)
    try:
        workload = to_workload(body.workload, ("workload",), inline=False)
        trial = body.trial_request().to_trial(workload.train.precision)
        workload = traced_for(workload, trial)
        est = checked_estimate(workload, trial)
    except FieldError as error:
        raise invalid(error) from None
    fit = load_fit(store, workload.cluster.hardware_key, workload.model.family)
    throughput = throughput_summary(workload, trial, fit)
    return EstimateResponse(**est.to_dict(), ds_config=trial.ds_config, throughput=throughput)


def _longest_answer(body: EstimateRequest, request: Request) -> EstimateResponse:
    """``seq_len: "max"``: the answer, the estimate of its config at its length and the throughput there (bad input:
    :class:`FieldError`, an answer too)."""
    store = store_of(request)
    workload = traced_workload(body.workload)
    trial = body.trial_request().to_trial(workload.train.precision)
    # the activations of the precision the pinned sections train in (torch_autocast), as --max-seq-len traces them
    workload = traced_for(workload, trial, lengths=TRACE_LENGTHS)
    checked_estimate(workload, trial)  # a bad ds_config: 422 at its key
    fit = load_fit(store, workload.cluster.hardware_key, workload.model.family)
    answer = longest(workload, estimate_pins(body), body.margin, fit.factors)
    throughput = throughput_summary(answer.workload, answer.trial, fit)
    return EstimateResponse(
        **answer.estimate.to_dict(), ds_config=answer.trial.ds_config, throughput=throughput,
        max_seq_len=MaxSeqLenOut.model_validate(answer.to_dict()),
    )  # fmt: skip
