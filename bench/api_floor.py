"""The floor for ``bench/api_load.py``: what this machine, uvicorn and FastAPI serve with no dstune work at all.

The same route, the same request model validated, and a constant answer of the same size as a real
recommendation. Served by ``uvicorn api_floor:app --app-dir bench``; the load test runs it side by side with
``dstune serve`` so the two figures come from one run on one machine.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

from fastapi import FastAPI, Response

from tuner.api import RecommendRequest, RecommendResponse, freeze_startup_objects


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    freeze_startup_objects()  # as dstune serve does
    yield


app = FastAPI(max_body_size=1_000_000, lifespan=lifespan)
ANSWER = RecommendResponse(
    source="measured",
    ds_config={"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "train_batch_size": 16}
    | {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True}},
    activation_checkpointing=False,
    tokens_per_s=5000.0,
    peak_bytes=2**33,
    estimated_peak_bytes=2**33,
    trial_id=1,
    study="floor",
    workload_fingerprint="0" * 64,
    measured_on="0" * 64,
    margin=0.05,
)
CONTENT = json.dumps(ANSWER.model_dump(mode="json")).encode()


@app.post("/v1/recommend")
async def recommend(body: RecommendRequest) -> Response:
    """Validate the request like dstune does, answer a constant."""
    return Response(CONTENT, media_type="application/json")
