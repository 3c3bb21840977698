"""The node's fork server killed or stopped while a real study's run is in flight (local launcher, 2 CPU ranks of
tiny-gpt2): the run is lost infrastructure, not the config's failure, so the config is measured again and ends
``ok``; no rank is left behind and the study finishes instead of hanging. ``bench/faults.py`` runs the same scenario
for its fault matrix."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("psutil")

import psutil
from faultkit import MARKER_ENV, marked_processes, rank_processes, wait_for

from tuner.measure.dispatch import Dispatcher
from tuner.measure.options import MeasureOptions
from tuner.storage import Store
from tuner.study import Event, StudySettings, TuningStudy
from tuner.units import GiB
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

pytestmark = pytest.mark.deepspeed
ORPHAN_GRACE_S = 10.0
SPACE = """\
version: 1
base:
  optimizer:
    params: {lr: 1.0e-4, torch_adam: true}
parameters:
  stage:
    kind: categorical
    choices: [1]
    key: zero_optimization.stage
    default: 1
  micro_batch:
    kind: categorical
    choices: [1]
    key: train_micro_batch_size_per_gpu
    default: 1
"""


@dataclass
class ServerFault:
    """What one injection did: the config's final record, the study's events (with their monotonic times), when the
    fault struck, when the study ended, and the ranks still alive :data:`ORPHAN_GRACE_S` after it."""

    status: str
    attempts: int
    error: str | None
    injected_at: float
    ended_at: float
    orphans: int
    events: list[tuple[float, Event]] = field(default_factory=list)

    def failed_events(self) -> list[tuple[float, Event]]:
        return [(at, event) for at, event in self.events if event.status == "failed"]


def fork_server_fault(folder: Path, fault: signal.Signals, marker: str, timeout: float = 900.0) -> ServerFault:
    """A one-config study through the local launcher; once both ranks of its run are up, ``fault`` is sent to the
    fork server that forked them. A stopped server is killed once the study ended (this scenario stopped it)."""
    space = folder / "space.yaml"
    space.write_text(SPACE)
    workload = Workload(
        load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, device="cpu", gpu_memory=64 * GiB), TrainSpec(32)
    )
    settings = StudySettings(
        name="forkserver",
        workload=workload,
        space_path=space,
        global_batch=2,
        sampler="random",
        trials=1,
        seed=1,
        dispatch=MeasureOptions(launcher="local", warmup=1, steps=2, timeout=600.0),
        early_stop=None,
    )
    events: list[tuple[float, Event]] = []
    outcome: list[Any] = []
    with Store.open(f"sqlite:///{folder / 'dstune.db'}") as store:
        study = TuningStudy(settings, store, lambda event: events.append((time.monotonic(), event)))
        dispatcher = Dispatcher(settings.dispatch, "cpu", workload.cluster.world_size)

        def run() -> None:
            try:
                outcome.append(study.run(dispatcher))
            except BaseException as error:  # reported by the caller, not lost in the thread
                outcome.append(error)
            finally:
                dispatcher.close()

        thread = threading.Thread(target=run)
        thread.start()
        server = None
        try:
            ranks = wait_for(lambda: both_ranks(marker) or not thread.is_alive(), 600, "both ranks of the run")
            assert thread.is_alive(), f"the study ended before its run was up: {outcome}"
            server = fork_server_of(ranks)
            os.kill(server.pid, fault)
            injected = time.monotonic()
            thread.join(timeout)
            assert not thread.is_alive(), f"the study did not end within {timeout:.0f} s of the fault"
            ended = time.monotonic()
        finally:
            if fault == signal.SIGSTOP and server is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    server.kill()  # SIGKILL reaches a stopped process: it goes, with its zombies
        assert not isinstance(outcome[0], BaseException), outcome[0]
        [record] = store.trials(study.study_id)
    return ServerFault(
        record.status, record.attempts, record.error, injected, ended, orphans_after(marker, ended), events
    )


def both_ranks(marker: str) -> list[Any]:
    """Both ranks of the run, once both are up as ranks (forked and retitled)."""
    ranks = rank_processes(marked_processes(marker))
    return ranks if len(ranks) == 2 else []


def fork_server_of(ranks: list[Any]) -> Any:
    """The fork server that forked ``ranks`` (their common parent)."""
    [parent] = {rank.ppid() for rank in ranks}
    server = psutil.Process(parent)
    assert "tuner.measure.forkserver" in " ".join(server.cmdline()), server.cmdline()
    return server


def orphans_after(marker: str, since: float) -> int:
    """Ranks still alive :data:`ORPHAN_GRACE_S` after ``since`` (killed then, so none outlives the test)."""
    with contextlib.suppress(AssertionError):
        wait_for(
            lambda: not rank_processes(marked_processes(marker)), max(0.1, since + ORPHAN_GRACE_S - time.monotonic())
        )
        return 0
    left = rank_processes(marked_processes(marker))
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return len(left)


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    value = f"dstune-fault-{uuid.uuid4().hex}"
    monkeypatch.setenv(MARKER_ENV, value)
    return value


def test_a_fork_server_killed_mid_run_loses_no_config(tmp_path: Path, marker: str) -> None:
    """SIGKILL: both ranks die with the server; the run is InfraLost, recorded failed, and the config is measured
    again through a new server: its final record is ``ok`` after two attempts."""
    result = fork_server_fault(tmp_path, signal.SIGKILL, marker)
    assert (result.status, result.attempts) == ("ok", 2), result.error
    [(_, failed)] = result.failed_events()
    assert "fork server was lost mid-run" in (failed.reason or "") and "queued to run again" in (failed.reason or "")
    assert result.orphans == 0


def test_a_fork_server_stopped_mid_run_does_not_hang_the_study(
    tmp_path: Path, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP: the ranks it forked carry on; the launcher stops asking the silent server after its answer timeout,
    reads the ranks' ends through /proc and the run is measured ``ok`` the first time."""
    from tuner.measure.forkserver import client as forkserver

    monkeypatch.setattr(forkserver, "ANSWER_TIMEOUT_S", 5.0)
    result = fork_server_fault(tmp_path, signal.SIGSTOP, marker)
    assert result.status == "ok", result.error
    assert result.attempts == 1 and not result.failed_events()
    assert result.orphans == 0
