"""``POST /v1/recommend``: a workload → the best config, ``source`` measured | nearest | estimate
(:mod:`tuner.recommend`), answered through the app's :class:`tuner.api.answer_cache.AnswerCache`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from tuner.api.budget import within
from tuner.api.deps import invalid, store_of
from tuner.api.responses import BODY, answers
from tuner.api.schemas import RecommendRequest, RecommendResponse
from tuner.recommend import NoFeasibleConfig, recommend
from tuner.requests import FieldError, check_request, to_workload

router = APIRouter(tags=["recommend"])


@router.post(
    "/v1/recommend",
    response_model=RecommendResponse,
    responses=answers(BODY, {422: {"description": "Bad workload, or no config of the default space fits it."}}),
)
async def recommend_endpoint(body: RecommendRequest, request: Request) -> Response:
    """The best config for a workload: measured, else the nearest measured one re-checked, else estimated."""
    store = store_of(request)  # not a sync dependency: that would cost a worker-thread hop per request

    def answer() -> bytes:  # blocking (database, estimator): runs in a worker thread
        workload = to_workload(body.workload, ("workload",), inline=False)
        return RecommendResponse(**recommend(store, workload).to_dict()).model_dump_json().encode()

    try:  # keyed by the request's workload as sent; a bad workload is an answer too (the same 422 each time)
        check_request(body.workload, ("workload",))  # what bounds the cost, on the loop: no thread for hostile input
        content = await within(
            request.app.state.recommend_cache.get(body.workload.model_dump_json(), answer),
            request.app.state.request_budget_s,
        )
    except FieldError as error:
        raise invalid(error) from None
    except NoFeasibleConfig as error:
        raise invalid(FieldError(("workload",), str(error))) from None
    return Response(content, media_type="application/json")
