"""The HTTP API (FastAPI), served by ``dstune serve``: estimate, recommend, studies and jobs. A face: thin over
:mod:`tuner.recommend`, :mod:`tuner.study.jobs` and :mod:`tuner.storage`.
"""

from tuner.api.app import RecommendRequest, RecommendResponse, create_app, freeze_startup_objects

__all__ = ["RecommendRequest", "RecommendResponse", "create_app", "freeze_startup_objects"]
