"""The real ``dstune serve`` under a flood of seq_len "max" requests from one address: the flood computes one answer
at a time and is refused unstarted past that, while another client's request (the token holder's from the same
address, another address behind the same proxy) starts at once and is answered: 503 with a Retry-After while it is
computed past the budget, then 200 from the kept answer. A real server process and real HTTP clients; the test waits
on answers, not on time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.api.test_serve_process import start_server

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow

LONG = {"model": "llama-2-7b", "model_impl": "builtin", "seq_len": "max"}
FLOODER = {"X-Forwarded-For": "10.0.0.1"}  # uvicorn trusts the header from 127.0.0.1, as from a local proxy
DEADLINE_S = 300


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = start_server(tmp_path_factory.mktemp("served"), DSTUNE_REQUEST_BUDGET_S="0.3")
    yield url
    process.kill()
    process.wait()


def _flood(base: str, stop: threading.Event, seen: list[str]) -> None:
    """Distinct long questions from one address, 8 at a time, until ``stop``."""

    def one(n: int) -> None:
        with httpx.Client(base_url=base, headers=FLOODER, timeout=120) as client:
            while not stop.is_set():
                body = {"workload": {**LONG, "gpus": 8, "nodes": 1 + n % 64}}
                seen.append(client.post("/v1/estimate", json=body).text)
                n += 8

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))


def _answered(base: str, body: dict[str, Any], headers: dict[str, str]) -> list[httpx.Response]:
    """Ask until the answer is 200 (each 503 honoured up to 2 s); every answer on the way."""
    answers = []
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        while time.monotonic() < deadline:
            answers.append(client.post("/v1/estimate", json=body))
            if answers[-1].status_code != 503:
                return answers
            time.sleep(min(2, int(answers[-1].headers["Retry-After"])))
    return answers


def test_a_flood_from_one_address_does_not_stop_another_clients_answer(base: str) -> None:
    stop, seen = threading.Event(), []
    flood = threading.Thread(target=_flood, args=(base, stop, seen))
    flood.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not any("this client already has" in text for text in seen):  # the flood holds its one slot
            assert time.monotonic() < deadline and flood.is_alive()
            time.sleep(0.05)
        others = [
            _answered(base, {"workload": {**LONG, "gpus": 4}}, {**FLOODER, "Authorization": "Bearer t0ken"}),
            _answered(base, {"workload": {**LONG, "gpus": 2}}, {"X-Forwarded-For": "10.0.0.2"}),
        ]
    finally:
        stop.set()
        flood.join()
    for answers in others:
        assert answers[-1].status_code == 200, answers[-1].text
        assert answers[-1].json()["max_seq_len"]["seq_len"] > 0
        refused = [answer.text for answer in answers if "nothing was started" in answer.text]
        assert not refused, refused  # started at the first ask: the flood's address cannot take this slot
        assert all(int(answer.headers["Retry-After"]) >= 1 for answer in answers[:-1])
    assert all("Traceback" not in text and "Internal Server Error" not in text for text in seen)
    assert sum("nothing was started" in text for text in seen) > 0
