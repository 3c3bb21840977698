"""The environment failing under the API: a full disk answers 503 with Retry-After (not 500) and
/healthz reports the server degraded; bugs stay 500. The full disk is real: SQLite's ``max_page_count`` caps the
database file so the next write fails with SQLite's own "database or disk is full"."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from tuner.api import create_app, degraded

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOB = {"workload": {"model": "tiny-gpt2", "device": "cpu", "model_impl": "builtin", "seq_len": 64}, "launcher": "local"}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Any]:
    application = create_app(f"sqlite:///{tmp_path / 'dstune.db'}", token=TOKEN)
    yield application
    application.state.store.close()


def _fill_the_disk(app: Any) -> None:
    """Every new connection may not grow the file by a page: SQLite reports the disk full on the next write."""
    engine = app.state.store.engine
    engine.dispose()

    @event.listens_for(engine, "connect")
    def _cap(dbapi_connection: Any, _record: Any) -> None:
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_is_503_and_healthz_says_degraded(app: Any) -> None:
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        _fill_the_disk(app)
        answers = [client.post("/v1/jobs", json=JOB, headers=AUTH) for _ in range(40)]
        full = [answer for answer in answers if answer.status_code == 503]
        assert {answer.status_code for answer in answers} <= {201, 503}, [a.text for a in answers]
        assert full, "the capped database never filled"
        assert full[0].headers["Retry-After"] == str(degraded.RETRY_AFTER_S)
        assert "disk full" in full[0].json()["detail"]
        health = client.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "degraded", health.text
        assert "disk full" in health.json()["detail"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_an_oserror_for_want_of_disk_is_503(app: Any, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(code, "No space left on device", "/var/lib/dstune")

    monkeypatch.setattr(app.state.store, "enqueue_job", full)
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.post("/v1/jobs", json=JOB, headers=AUTH)
        assert answer.status_code == 503 and "Retry-After" in answer.headers, answer.text
        health = client.get("/healthz")
        assert health.json()["status"] == "degraded"
        for shown in (answer.text, health.text):  # /healthz is open to anyone: no server path
            assert "/var/lib/dstune" not in shown and "disk full: <path>" in shown, shown


def test_degraded_wears_off(app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(degraded, "DEGRADED_S", 0.0)
    app.state.degraded = (0.0, "disk full: x")
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok", "database": "sqlite"}


def test_a_bug_stays_a_server_error(app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(app.state.store, "enqueue_job", bug)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v1/jobs", json=JOB, headers=AUTH).status_code == 500
        assert client.get("/healthz").json()["status"] == "ok"
