"""``TuningStudy.run`` stopping mid-run: no measured run may go on behind a loop that ended."""

from __future__ import annotations

import importlib.util
import os
import time
import uuid
from pathlib import Path

import pytest

if importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("psutil") is None:
    pytest.skip("needs DeepSpeed and psutil", allow_module_level=True)  # found without importing: collection stays fast

from faultkit import MARKER_ENV, marked_processes
from faultkit import rank_processes as ranks_among

from tuner.measure.dispatch import Dispatcher
from tuner.requests import JobRequest, check_job
from tuner.storage import Store
from tuner.study import TuningStudy
from tuner.worker import study_settings

pytestmark = pytest.mark.deepspeed


@pytest.fixture(autouse=True)
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """A marker the ranks started from here on carry in their environment (they are the node's fork server's
    children, not this process's)."""
    value = f"dstune-study-{uuid.uuid4().hex}"
    monkeypatch.setenv(MARKER_ENV, value)
    return value


def rank_processes() -> list:
    """Live rank processes of this test's runs (zombies are dead)."""
    return ranks_among(marked_processes(os.environ[MARKER_ENV]))


def long_study(store: Store, name: str) -> tuple[TuningStudy, Dispatcher]:
    """A study of tiny-gpt2 on CPU whose first measured run would train for minutes (10,000 timed steps)."""
    request = JobRequest.model_validate(
        {
            "workload": {"model": "tiny-gpt2", "device": "cpu", "gpu_memory": "64GiB", "seq_len": 64},
            "study": name,
            "launcher": "local",
            "sampler": "random",
            "seed": 1,
            "global_batch": 8,
            "trials": 3,
            "steps": 10_000,
            "run_timeout": 1800,
        }
    )
    settings = study_settings(request, check_job(request))
    study = TuningStudy(settings, store)
    return study, Dispatcher(settings.dispatch, "cpu", settings.workload.cluster.world_size)


def test_a_failing_stop_check_kills_the_run_in_flight(tmp_path: Path) -> None:
    """``should_stop`` itself fails (say the database went away) while a run trains: the error propagates, and the
    run's ranks are killed rather than left training; the trial stays running in the store, for a resumed study to
    fail and retry."""
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        study, dispatcher = long_study(store, "failing-check")

        def should_stop() -> bool:
            if rank_processes():
                time.sleep(2)  # the rank is importing torch / starting DeepSpeed
                raise ConnectionError("database unreachable")
            return False

        try:
            with pytest.raises(ConnectionError):
                study.run(dispatcher, should_stop=should_stop)
            deadline = time.monotonic() + 20
            while rank_processes():
                assert time.monotonic() < deadline, "the run went on behind the failed loop"
                time.sleep(0.2)
        finally:
            dispatcher.cancel()  # whatever happened above, no rank outlives the test
            dispatcher.close(wait=True)
        statuses = [trial.status for trial in store.trials(study.study_id)]
        assert statuses.count("running") == 1
