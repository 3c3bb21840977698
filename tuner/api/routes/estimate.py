"""``POST /v1/estimate``: a workload and a ds_config (or the CLI's shortcut fields) → the estimate by category.

The estimate runs in a worker thread within the request's time budget (:mod:`tuner.api.budget`: 503 past it)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from tuner.api.budget import within
from tuner.api.deps import invalid, store_of
from tuner.api.responses import BODY, answers
from tuner.api.schemas import EstimateRequest, EstimateResponse
from tuner.estimator import ConfigError, MemoryEstimate, estimate
from tuner.forecast import load_fit, throughput_summary
from tuner.requests import FieldError, Loc, TrialRequest, check_request, to_workload
from tuner.workload import TrialConfig, Workload

router = APIRouter(tags=["estimate"])


def checked_estimate(workload: Workload, trial: TrialConfig, loc: Loc = ("ds_config",)) -> MemoryEstimate:
    """:func:`tuner.estimator.estimate`, with a :class:`ConfigError` (or arithmetic on absurd values) as a
    :class:`FieldError` at the config key's path."""
    try:
        return estimate(workload, trial)
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
    try:
        check_request(body.workload, ("workload",))  # what bounds the cost, on the loop: no thread for hostile input
    except FieldError as error:
        raise invalid(error) from None
    return await within(asyncio.to_thread(_answer, body, request), request.app.state.request_budget_s)


def _answer(body: EstimateRequest, request: Request) -> EstimateResponse:
    """The estimate (blocking: profile service, estimator, database)."""
    store = store_of(request)
    try:
        workload = to_workload(body.workload, ("workload",), inline=False)
        asked = TrialRequest(
            **body.workload.trial_fields(),  # the workload object's micro_batch, grad_accum, checkpointing
            stage=body.stage,
            offload_optimizer=body.offload_optimizer,
            offload_param=body.offload_param,
            sequence_parallel=body.sequence_parallel,
            tiled_mlp_shards=body.tiled_mlp_shards,
            tiled_loss_shards=body.tiled_loss_shards,
            offload_checkpoints=body.offload_checkpoints,
            ds_config=body.ds_config,
        )
        trial = asked.to_trial(workload.train.precision)
        est = checked_estimate(workload, trial)
    except FieldError as error:
        raise invalid(error) from None
    fit = load_fit(store, workload.cluster.hardware_key, workload.model.family)
    throughput = throughput_summary(workload, trial, fit)
    return EstimateResponse(**est.to_dict(), ds_config=trial.ds_config, throughput=throughput)
