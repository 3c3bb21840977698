"""The HTTP API (FastAPI), served by ``dstune serve``: estimate, recommend, studies and jobs. A face: thin over
:mod:`tuner.requests`, :mod:`tuner.recommend`, :mod:`tuner.requests`, :mod:`tuner.estimator` and
:mod:`tuner.storage` (and it includes :mod:`tuner.dashboard`'s router). Nothing below imports it.

``app`` builds the app and its state (:func:`create_app`), ``schemas`` holds the request/response models (the OpenAPI
schema), ``routes`` one router per resource, ``deps`` what the routers share (store, token check, 422s) and
``answer_cache`` the recommendation cache.
"""

from tuner.api.app import create_app, freeze_startup_objects
from tuner.api.schemas import RecommendRequest, RecommendResponse

__all__ = ["RecommendRequest", "RecommendResponse", "create_app", "freeze_startup_objects"]
