"""``POST /v1/recommend``: a workload → the best config, ``source`` measured | nearest | estimate
(:mod:`tuner.recommend`), answered through the app's :class:`tuner.api.answer_cache.AnswerCache`; with
``workload.seq_len: "max"``, the config that reaches the longest sequence that fits, and ``max_seq_len`` (computed
once, kept, a bounded number at once: :mod:`tuner.api.long_answers`)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from tuner.api.budget import within
from tuner.api.deps import invalid, store_of
from tuner.api.long_answers import answer_once
from tuner.api.longest import LOC, asks_max, traced_workload
from tuner.api.responses import BODY, answers
from tuner.api.schemas import MaxSeqLenOut, RecommendRequest, RecommendResponse
from tuner.estimator import ConfigError
from tuner.forecast import NoLengthFits
from tuner.recommend import NoFeasibleConfig, recommend, recommend_longest
from tuner.requests import FieldError, check_request, to_workload

router = APIRouter(tags=["recommend"])
NOT_WITH_MAX = 'not with seq_len "max": the length search trains micro-batch 1 without accumulation'
UNFIT = "Bad workload, or no config of the default space fits it (seq_len max: not even the shortest length fits)."


@router.post(
    "/v1/recommend",
    response_model=RecommendResponse,
    responses=answers(BODY, {422: {"description": UNFIT}}),
)
async def recommend_endpoint(body: RecommendRequest, request: Request) -> Response:
    """The best config for a workload: measured, else the nearest measured one re-checked, else estimated."""
    store = store_of(request)  # not a sync dependency: that would cost a worker-thread hop per request

    def answer() -> bytes:  # blocking (database, estimator): runs in a worker thread
        if asks_max(body.workload):
            found, longest = recommend_longest(store, traced_workload(body.workload))
            response = RecommendResponse(**found.to_dict(), max_seq_len=MaxSeqLenOut.model_validate(longest.to_dict()))
            return response.model_dump_json().encode()
        workload = to_workload(body.workload, ("workload",), inline=False)
        try:
            found = recommend(store, workload, body.global_batch)
        except ConfigError as error:
            raise FieldError((error.field,), error.message) from None
        return RecommendResponse(**found.to_dict()).model_dump_json().encode()

    try:  # keyed by the request as sent; a bad workload is an answer too (the same 422 each time)
        check_request(body.workload, ("workload",))  # what bounds the cost, on the loop: no thread for hostile input
        if asks_max(body.workload) and body.global_batch is not None:
            raise FieldError(("global_batch",), NOT_WITH_MAX)
        if asks_max(body.workload):
            content = await answer_once(request, "recommend", body, answer)
        else:
            cached = request.app.state.recommend_cache.get(body.model_dump_json(), answer)
            content = await within(cached, request.app.state.request_budget_s)
    except FieldError as error:
        raise invalid(error) from None
    except NoFeasibleConfig as error:
        raise invalid(FieldError(("workload",), str(error))) from None
    except NoLengthFits as error:
        raise invalid(FieldError((*LOC, "seq_len"), str(error))) from None
    return Response(content, media_type="application/json")
