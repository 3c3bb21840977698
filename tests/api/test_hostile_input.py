"""Hostile input at the API: non-finite numbers anywhere (typed fields and free-form objects), control
characters in any string that would reach the database, and study names outside the one rule are 422 naming the
field, never 500 and never silently stored as null."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tuner.api import create_app

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WORKLOAD = {"model": "tiny-gpt2", "device": "cpu", "model_impl": "builtin"}
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]}
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


def _placements(bad: str) -> list[tuple[str, str, str]]:
    """(path, body as JSON text, the field the answer must name) with ``bad`` in each kind of place."""
    w = json.dumps(WORKLOAD)[:-1]
    return [
        ("/v1/estimate", f'{{"workload": {{"params": {bad}}}}}', "params"),
        ("/v1/estimate", f'{{"workload": {{"model": "tiny-gpt2", "gpu_memory": {bad}}}}}', "gpu_memory"),
        ("/v1/estimate", f'{{"workload": {w}}}, "ds_config": {{"gradient_clipping": {bad}}}}}', "gradient_clipping"),
        (
            "/v1/estimate",
            f'{{"workload": {w}}}, "ds_config": {{"optimizer": {{"params": {{"lr": [1, {bad}]}}}}}}}}',
            "lr",
        ),
        ("/v1/estimate", f'{{"workload": {w}, "peft": {{"r": 8, "lora_alpha": {bad}}}}}}}', "lora_alpha"),
        ("/v1/estimate", f'{{"workload": {w}, "quantization": {{"load_in_4bit": {bad}}}}}}}', "load_in_4bit"),
        ("/v1/estimate", f'{{"workload": {{"config": {{"model_type": "gpt2", "n_embd": {bad}}}}}}}', "n_embd"),
        ("/v1/recommend", f'{{"workload": {w}, "peft": {{"lora_dropout": {bad}}}}}}}', "lora_dropout"),
        ("/v1/jobs", f'{{"workload": {w}}}, "pins": {{"stage": {bad}}}}}', "stage"),
        ("/v1/jobs", f'{{"workload": {w}}}, "timeout_s": {bad}}}', "timeout_s"),
    ]


CASES = [case for bad in NON_FINITE for case in _placements(bad)]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("hostile") / "dstune.db"
    with TestClient(create_app(f"sqlite:///{db}", token=TOKEN, recommend_cache_s=0)) as test_client:
        yield test_client


def _names(answer: Any) -> str:
    return json.dumps(answer["detail"])


@pytest.mark.parametrize(("path", "body", "field"), CASES)
def test_non_finite_numbers_are_422_naming_the_field(client: TestClient, path: str, body: str, field: str) -> None:
    response = client.post(path, content=body, headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert field in _names(response.json())


@pytest.mark.parametrize("text", ["a\x00b", "a\x1bb", "\x7f"])
@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda t: {"workload": {"config": {"model_type": "gpt2", "_name_or_path": t}}}, "_name_or_path"),
        (lambda t: {"workload": {**WORKLOAD, "freeze": t}}, "freeze"),
        (lambda t: {"workload": WORKLOAD, "ds_config": {t: 1}}, "ds_config"),
        (lambda t: {"workload": {**WORKLOAD, "peft": {**LORA, "target_modules": [t]}}}, "target_modules"),
    ],
)
def test_control_characters_are_422_naming_the_field(client: TestClient, text: str, make: Any, field: str) -> None:
    for path in ("/v1/estimate", "/v1/jobs"):
        body = make(text)
        if path == "/v1/jobs" and "ds_config" in body:
            continue
        response = client.post(path, json=body, headers=AUTH)
        assert response.status_code == 422, response.text
        assert field in _names(response.json())


@pytest.mark.parametrize("name", ["%00", "a%00b", "%1b", "x" * 300])
def test_study_paths_outside_what_can_be_stored_are_422(client: TestClient, name: str) -> None:
    for suffix in ("", "/trials"):
        response = client.get(f"/v1/studies/{name}{suffix}")
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["path", "name"]


@pytest.mark.parametrize("name", ["", "a b", "-lead", "é", "\U0001f600", "a\nb", "x" * 129])
def test_job_study_names_follow_the_one_rule(client: TestClient, name: str) -> None:
    response = client.post("/v1/jobs", json={"workload": WORKLOAD, "study": name}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][-1] == "study"


def test_absurd_nesting_is_refused_not_500(client: TestClient) -> None:
    deep = "[" * 80 + "]" * 80
    response = client.post(
        "/v1/estimate",
        content=f'{{"workload": {json.dumps(WORKLOAD)}, "ds_config": {{"x": {deep}}}}}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("depth", [500, 900, 5000])
@pytest.mark.parametrize("place", ["ds_config", "pins", "config"])
def test_nesting_hundreds_deep_is_422_at_its_field_in_one_answer(client: TestClient, depth: int, place: str) -> None:
    """Past the 64 levels a free-form object may hold: the 422's echo of the input used to exceed Python's recursion
    limit (a 500), and past the JSON parser's own limit FastAPI answered a bare 400."""
    nested = '{"a":' * depth + "1" + "}" * depth
    path, body = {
        "ds_config": ("/v1/estimate", f'{{"workload": {json.dumps(WORKLOAD)}, "ds_config": {nested}}}'),
        "pins": ("/v1/jobs", f'{{"workload": {json.dumps(WORKLOAD)}, "pins": {nested}}}'),
        "config": ("/v1/recommend", f'{{"workload": {{"config": {{"model_type": "gpt2", "x": {nested}}}}}}}'),
    }[place]
    response = client.post(path, content=body, headers={"content-type": "application/json", **AUTH})
    assert response.status_code == 422, response.text
    where = response.json()["detail"][0]["loc"]
    assert where == ["body"] if depth > 990 else place in where, response.text


def test_the_database_never_stores_a_refused_value(client: TestClient, tmp_path: Path) -> None:
    """gradient_clipping NaN used to come back 200 with null: now nothing is estimated from it."""
    body = f'{{"workload": {json.dumps(WORKLOAD)}, "ds_config": {{"gradient_clipping": NaN}}}}'
    response = client.post("/v1/estimate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422


@pytest.mark.parametrize("field", ["params", "gpus", "seq_len"])
def test_a_boolean_is_not_a_number(client: TestClient, field: str) -> None:
    """Schemathesis found ``{"params": true}`` answered as 1 parameter: pydantic's lax mode reads true as 1."""
    response = client.post("/v1/recommend", json={"workload": {"model": "tiny-gpt2", field: True}})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][-1] == field
