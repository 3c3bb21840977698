"""The API's routers: every resource's operations keep their paths, methods, operation ids and tags (what generated
clients are built from), and the mutating ones keep the token check."""

from __future__ import annotations

from pathlib import Path

from tuner.api import create_app

OPERATIONS = [
    ("/healthz", "get", "healthz_healthz_get", ["health"]),
    ("/v1/estimate", "post", "estimate_endpoint_v1_estimate_post", ["estimate"]),
    ("/v1/recommend", "post", "recommend_endpoint_v1_recommend_post", ["recommend"]),
    ("/v1/studies", "get", "list_studies_v1_studies_get", ["studies"]),
    ("/v1/studies/{name}", "get", "get_study_v1_studies__name__get", ["studies"]),
    ("/v1/studies/{name}/trials", "get", "study_trials_v1_studies__name__trials_get", ["studies"]),
    ("/v1/jobs", "post", "create_job_v1_jobs_post", ["jobs"]),
    ("/v1/jobs", "get", "list_jobs_v1_jobs_get", ["jobs"]),
    ("/v1/jobs/{job_id}", "get", "get_job_v1_jobs__job_id__get", ["jobs"]),
    ("/v1/jobs/{job_id}", "delete", "cancel_job_v1_jobs__job_id__delete", ["jobs"]),
]


def test_operations_in_order(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'dstune.db'}", "token")
    try:
        schema = app.openapi()
    finally:
        app.state.store.close()
    found = [
        (path, method, op["operationId"], op["tags"])
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    ]
    assert found == OPERATIONS
    secured = {
        (path, method) for path, ops in schema["paths"].items() for method, op in ops.items() if op.get("security")
    }
    reading = {(path, "get") for path in ("/v1/studies", "/v1/studies/{name}", "/v1/studies/{name}/trials")}
    reading |= {("/v1/jobs", "get"), ("/v1/jobs/{job_id}", "get")}  # optional: with it, records whole (readers.py)
    assert secured == {("/v1/jobs", "post"), ("/v1/jobs/{job_id}", "delete")} | reading
