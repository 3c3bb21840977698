"""PostgreSQL restarted mid-study (stop, wait, start) on a private server of our own: the store retries what is safe
and loses no finished measurement, a worker running a real study job carries on, and the API answers 503 (not 500)
while the database is down and 200 once it is back."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from faultkit import PrivatePostgres, pruned_job_request, wait_for
from test_leases import check_study

from tuner.errors import InputError
from tuner.storage import DatabaseUnavailable, Store, is_disconnect
from tuner.worker import work
from tuner.workload import Workload, model_from_param_count

DOWN_S = 2.0  # how long the server stays down in each restart


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    try:
        private = PrivatePostgres()
    except (RuntimeError, OSError) as error:
        pytest.skip(f"no PostgreSQL server binaries: {error}")
    try:
        private.start()
        yield private
    finally:
        private.destroy()


@pytest.fixture
def pg(server: PrivatePostgres) -> Iterator[str]:
    """A fresh database on the private server; the server is running when the test starts and when it ends."""
    name = f"restart_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield sa.make_url(server.url).set(database=name).render_as_string(hide_password=False)
    server.start() if not _up(server) else None
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def _up(server: PrivatePostgres) -> bool:
    engine = sa.create_engine(server.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect():
            return True
    except sa.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def restart(server: PrivatePostgres) -> None:
    server.stop()
    time.sleep(DOWN_S)  # the outage; what follows waits on conditions
    server.start()


def new_trial(store: Store) -> tuple[int, int]:
    workload_id = store.upsert_workload(Workload(model_from_param_count(1e9)))
    study = store.get_or_create_study("s", workload_id, "tpe", {})
    trial_id = store.add_trial(study.id, 0, "k", {"zero_optimization": {"stage": 1}}, {"stage": 1}, False, None)
    store.start_trial(trial_id)
    return study.id, trial_id


def test_a_measurement_finished_while_the_database_is_down_is_recorded_once_it_is_back(
    server: PrivatePostgres, pg: str
) -> None:
    with Store.open(pg, retry_s=300) as store:
        study_id, trial_id = new_trial(store)
        store.list_studies()  # a pooled connection that the restart will kill
        server.stop()
        outcome: list[object] = []
        writer = threading.Thread(
            target=lambda: outcome.append(store.finish_trial(trial_id, "ok", {"tokens_per_s": 42.0}))
        )
        writer.start()
        time.sleep(DOWN_S)
        assert writer.is_alive() and not outcome  # waiting for the database, not failed
        server.start()
        writer.join(timeout=300)
        assert outcome and outcome[0].status == "ok"
    with Store.open(pg) as fresh:  # from a new connection: it landed, once
        assert [(t.status, t.tokens_per_s, t.attempts) for t in fresh.trials(study_id)] == [("ok", 42.0, 1)]


def test_a_database_down_longer_than_the_retry_window_is_unavailable_not_bad_input(
    server: PrivatePostgres, pg: str
) -> None:
    with Store.open(pg, retry_s=1.0) as store:
        store.list_studies()
        server.stop()
        try:
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as raised:
                store.list_jobs()
            assert time.monotonic() - started < 60
        finally:
            server.start()
        assert not isinstance(raised.value, InputError) and raised.value.retry_safe
        assert is_disconnect(raised.value.__cause__)
        assert store.list_jobs() == []  # the same store reconnects


def test_the_api_answers_503_while_the_database_is_down(server: PrivatePostgres, pg: str) -> None:
    from fastapi.testclient import TestClient

    from tuner.api import create_app
    from tuner.api.unavailable import register

    app = create_app(pg, token=None)
    register(app)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/v1/studies").status_code == 200
        server.stop()
        try:
            for path in ("/v1/studies", "/healthz", "/v1/jobs"):
                answer = client.get(path)
                assert answer.status_code == 503, (path, answer.status_code, answer.text)
                assert answer.headers["Retry-After"] and "database unavailable" in answer.json()["detail"]
                assert "password" not in answer.text
        finally:
            server.start()
        assert wait_for(lambda: client.get("/v1/studies").status_code == 200, 60, "the API to answer again")


def test_a_worker_running_a_study_carries_on_through_a_restart(server: PrivatePostgres, pg: str) -> None:
    """A real study job (every config pruned, so no training) is running when the server restarts: the worker's
    store and Optuna's storage retry, the job finishes done without a take-over, and no trial is lost or doubled."""
    with Store.open(pg) as store:
        job = store.enqueue_job("through", pruned_job_request("through", trials=300))
        stop = threading.Event()
        thread = threading.Thread(target=work, args=(store, "w"), kwargs={"poll": 0.2, "lease_s": 60.0, "stop": stop})
        thread.start()
        try:
            wait_for(lambda: (store.get_job(job.id).progress or {}).get("trials", 0) >= 5, 180, "the job to run")
            assert store.get_job(job.id).status == "running"
            restart(server)
            wait_for(lambda: store.get_job(job.id).status not in ("queued", "running"), 300, "the job to end")
        finally:
            stop.set()
            thread.join(timeout=120)
        final = store.get_job(job.id)
    assert final.status == "done" and final.attempts == 1, final.error
    check_study(pg, "through", budget=300)
