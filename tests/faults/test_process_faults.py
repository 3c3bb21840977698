"""Processes killed or stopped mid-run, with real DeepSpeed ranks on CPU: a rank SIGKILLed or SIGSTOPped mid-step, the
tuner itself SIGKILLed while runs are in flight (local launcher and Ray), a Ray worker node removed mid-run. Each time
the run is classified, nothing keeps running that nobody owns, and the study goes on or resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("psutil")

from fault_entry import FAULTED
from faultkit import MARKER_ENV, marked_processes, rank_processes, wait_for

from tuner.measure.driver.host_memory import HOST_MEMORY
from tuner.measure.driver.local_launcher import launch_local
from tuner.measure.measurement import INFRA_LOST, PEER_KILLED, Measurement
from tuner.measure.run_protocol import RunSpec
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model, workload_to_dict

pytestmark = pytest.mark.deepspeed
ENTRY = Path(__file__).with_name("fault_entry.py")
DSTUNE = str(Path(sys.executable).with_name("dstune"))
RSS_CAP = 3 * 2**29  # above a tiny rank's own resident memory, below what the grow fault adds to it
ORPHAN_GRACE_S = 10.0  # "a few seconds": how long a rank may outlive whoever owned it
TUNE = [
    *("--model", "tiny-gpt2", "--gpus", "1", "--seq-len", "32", "--device", "cpu", "--gpu-memory", "64GiB"),
    *("--global-batch", "4", "--warmup", "1", "--steps", "2", "--seed", "5", "--sampler", "random", "--trials", "3"),
]


def run_spec(gpus_per_node: int, steps: int = 2, nodes: int = 1) -> RunSpec:
    """A tiny-gpt2 run of ``nodes`` × ``gpus_per_node`` CPU ranks (on Ray, one bundle of ``gpus_per_node`` CPUs per
    node)."""
    cluster = ClusterSpec(gpus_per_node=gpus_per_node, nodes=nodes, device="cpu")
    workload = Workload(load_builtin_model("tiny-gpt2"), cluster, TrainSpec(seq_len=32))
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    return RunSpec(workload_to_dict(workload), ds_config, device="cpu", warmup=1, steps=steps)


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """A marker every process started from here on carries in its environment, to find leftovers by."""
    value = f"dstune-fault-{uuid.uuid4().hex}"
    monkeypatch.setenv(MARKER_ENV, value)
    return value


def no_ranks_left(marker: str) -> bool:
    return not rank_processes(marked_processes(marker))


# A SIGKILLed rank ends its run at once; a stopped one only at the run's timeout, which must outlast the start-up. So
# the stopped rank's run is given 30 s first (start-up takes seconds on a quiet host), and again with twice as long
# while its rank never reached the faulty step (a loaded host, a fork server still importing), past the 120 s every
# try had before (which passed even when the rank was stopped by the timeout before its step).
TIMEOUTS = {"sigkill": (120.0,), "sigstop": (30.0, 60.0, 120.0, 240.0)}


@pytest.mark.parametrize(("fault", "status"), [("sigkill", "error"), ("sigstop", "timeout")])
def test_a_rank_killed_or_stopped_mid_step_is_classified_and_its_peer_is_gone(
    marker: str, fault: str, status: str, tmp_path: Path
) -> None:
    for timeout in TIMEOUTS[fault]:
        run_dir = tmp_path / f"timeout-{timeout:.0f}"
        started = time.monotonic()
        entry = [sys.executable, str(ENTRY), fault, "1"]
        result = launch_local(run_spec(2), timeout=timeout, entry=entry, keep_dir=run_dir)
        if (run_dir / f"{FAULTED}1").exists():
            break
    assert (run_dir / f"{FAULTED}1").exists(), f"rank 1 never reached its faulty step: {result.error}"
    assert result.status == status, result.error
    assert time.monotonic() - started < timeout + 30  # every peer gone within the timeout (+ the stop grace)
    if fault == "sigkill":
        assert "killed by signal 9" in result.ranks[1].error
        assert result.ranks[0].exception_type == PEER_KILLED or result.ranks[0].status == "error"
    else:
        assert {rank.status for rank in result.ranks} == {"timeout"}
    assert no_ranks_left(marker)


def test_a_rank_growing_past_its_host_memory_cap_ends_the_run_oom(marker: str, tmp_path: Path) -> None:
    """A rank whose memory grows past its cap (its share of the host; here 1.5 GiB) is killed before it takes the
    host, whatever its estimate said: the run is ``oom`` / HostMemory, its peer gone."""
    started = time.monotonic()
    entry = [sys.executable, str(ENTRY), "grow", "1"]
    result = launch_local(run_spec(2), timeout=300, entry=entry, keep_dir=tmp_path, rss_cap=RSS_CAP)
    assert (tmp_path / f"{FAULTED}1").exists(), f"rank 1 never reached its step: {result.error}"
    assert result.status == "oom" and result.exception_type == HOST_MEMORY, result.error
    assert "past its cap of 1.50 GiB" in (result.error or "")
    assert time.monotonic() - started < 300  # the cap ended it, not the timeout
    assert no_ranks_left(marker)


def test_the_next_run_after_faulty_ones_measures(marker: str) -> None:
    """The study goes on: a run after killed and stopped ranks (ports, build locks, process groups) measures."""
    result = launch_local(run_spec(1), timeout=300)
    assert result.status == "ok", result.error


def trials_of(storage: str, study: str) -> list:
    with Store.open(storage) as store:
        record = store.get_study(study)
        return store.trials(record.id) if record else []


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_a_sigkilled_tuner_leaves_no_rank_and_resumes_without_loss_or_repeat(
    tmp_path: Path, marker: str, launcher: str
) -> None:
    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    command = [DSTUNE, "tune", *TUNE, "--launcher", launcher, "--storage", storage, "--study", "killed"]
    tuner = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: rank_processes(marked_processes(marker)), 600, "a measured run in flight")
    finally:
        os.kill(tuner.pid, signal.SIGKILL)  # the tuner alone: its ranks must go on their own
        tuner.wait()
    killed_at = time.monotonic()
    wait_for(lambda: no_ranks_left(marker), 60, "the ranks to die with the tuner")
    assert time.monotonic() - killed_at < ORPHAN_GRACE_S
    before = {t.config_key: t for t in trials_of(storage, "killed")}
    assert [t.status for t in before.values()].count("running") == 1
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    after = {t.config_key: t for t in trials_of(storage, "killed")}
    assert set(before) <= set(after) and not [t for t in after.values() if t.status in ("running", "pending")]
    for key, trial in before.items():  # nothing finished was lost or measured again
        if trial.status not in ("running", "pending"):
            assert (after[key].status, after[key].tokens_per_s, after[key].attempts) == (
                trial.status,
                trial.tokens_per_s,
                trial.attempts,
            )
    assert all(t.attempts <= 2 for t in after.values())  # the killed trial is retried once at most
    import optuna

    study = optuna.load_study(study_name="killed", storage=storage)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert no_ranks_left(marker)


def test_a_ray_node_removed_mid_run_fails_the_run_cleanly_and_the_rest_of_the_cluster_measures(
    marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two single-CPU nodes, one rank on each (a 2-node × 1-rank job); the worker node is removed once the ranks
    train: the run ends ``error`` with the reason, well before its timeout, no rank is left, and a run that fits the
    remaining node measures there."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from tuner.measure.driver.ray_launcher import launch_ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    node = cluster.add_node(num_cpus=1)
    training = threading.Event()
    outcome: list[Measurement | BaseException] = []

    def trained(times: list[float]) -> bool:
        training.set()
        return False  # never stop early

    def measure() -> None:
        try:
            outcome.append(launch_ray(run_spec(1, steps=100_000, nodes=2), timeout=600, on_step=trained))
        except BaseException as error:  # reported by the test, not lost in the thread
            outcome.append(error)

    try:
        ray.init(address=cluster.address, log_to_driver=False)
        run = threading.Thread(target=measure)
        started = time.monotonic()
        run.start()
        wait_for(lambda: training.is_set() or not run.is_alive(), 600, "rank 0 to report timed steps")
        assert training.is_set(), outcome  # the run ended before it trained (placement, start-up): say why
        assert len(rank_processes(marked_processes(marker))) == 2
        cluster.remove_node(node)
        run.join(timeout=300)
        assert not run.is_alive() and time.monotonic() - started < 600
        result = outcome[0]
        assert isinstance(result, Measurement) and result.status == "error" and result.error, result
        assert result.exception_type == INFRA_LOST and "lost mid-run" in result.error  # retried by the study
        wait_for(lambda: no_ranks_left(marker), 60, "the ranks to be gone")
        rerun = launch_ray(run_spec(1), timeout=300)
        assert rerun.status == "ok", rerun.error
    finally:
        ray.shutdown()
        cluster.shutdown()
