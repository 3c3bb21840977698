"""Measured runs with real DeepSpeed on CPU ranks, through both launchers, and every way a run can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
psutil = pytest.importorskip("psutil")

from tuner.measure.driver.local_launcher import launch_local  # noqa: E402
from tuner.measure.measurement import CANCELLED, COST_PHASES, PEER_KILLED, STOPPED_EARLY  # noqa: E402
from tuner.measure.run_protocol import RunSpec  # noqa: E402
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model, workload_to_dict  # noqa: E402

pytestmark = pytest.mark.deepspeed
FAULT_RANK = Path(__file__).with_name("fault_rank.py")
HUNG = "hung-rank-"  # fault_rank.py's RUN_DIR/hung-rank-N: rank N reached its hanging step


def run_spec(world: int, zero: dict | None = None, **config: object) -> RunSpec:
    workload = Workload(
        load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=world, device="cpu"), TrainSpec(seq_len=64)
    )
    ds_config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True},
        "zero_optimization": zero or {"stage": 2, "reduce_bucket_size": 50_000},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        **config,
    }
    return RunSpec(workload_to_dict(workload), ds_config, device="cpu", warmup=2, steps=3)


def assert_ok(result, world: int) -> None:
    assert result.status == "ok", result.error
    assert result.tokens_per_s > 0 and result.samples_per_s > 0
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 64)
    assert 0 < result.step_time_s["p50"] <= result.step_time_s["p90"]
    assert len(result.peak_bytes_per_rank) == world and all(b > 0 for b in result.peak_bytes_per_rank)
    for rank in result.ranks:
        assert len(rank.step_times) == 3
        assert rank.model_state_bytes > 0 and rank.peak_rss_bytes > rank.model_state_bytes
        assert {"imports_s", "initialize_s", "warmup_s", "timed_s"} <= set(rank.timings)
        # the warm-up taken apart: its cold step and probed step within it, the probe's sweeps within that step
        assert {"warmup_first_s", "warmup_probe_s", "probe_sweeps_s", "numerics_s", "peak_readback_s"} <= set(
            rank.timings
        )
        assert rank.timings["warmup_first_s"] + rank.timings["warmup_probe_s"] <= rank.timings["warmup_s"]
        assert rank.timings["probe_sweeps_s"] <= rank.timings["warmup_probe_s"]
        assert set(rank.breakdown) == {"forward_s", "backward_s", "step_s"}  # DeepSpeed's wall_clock_breakdown
        assert all(seconds > 0 for seconds in rank.breakdown.values())
    assert set(COST_PHASES) | {"wall_s", "overhead_s", "other_s"} == set(result.cost)
    assert result.cost["overhead_s"] == pytest.approx(result.cost["wall_s"] - result.cost["timed_s"])
    for rank in result.ranks:  # each rank's phases fit in the wall (the cost takes the slowest rank per phase)
        assert sum(rank.timings[phase] for phase in COST_PHASES) <= result.cost["wall_s"]
    assert not result.stopped_early


def leftover_processes(marker: str) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


@pytest.mark.parametrize("world", [1, 2])
def test_local_launcher_measures(world: int) -> None:
    """Also the settle-based warm-up: past the cold step and the probed one, steps go on until two agree (within
    10 %), at most 4 in all, the ranks deciding together."""
    spec = run_spec(world)
    spec.warmup_max = 4
    result = launch_local(spec, timeout=300)
    assert_ok(result, world)
    warmups = {rank.warmup_steps for rank in result.ranks}
    assert len(warmups) == 1 and 3 <= warmups.pop() <= 4


def test_a_forked_rank_measures_what_a_fresh_one_does() -> None:
    """Lean ranks fork from the node's fork server; fresh ones import everything themselves. The model states and
    activations each rank measures are the same bytes: nothing of the server (or of an earlier rank) is counted."""
    forked, fresh = run_spec(2), run_spec(2)
    fresh.lean = False
    first, second = launch_local(forked, timeout=300), launch_local(fresh, timeout=300)
    assert_ok(first, 2)
    assert_ok(second, 2)
    assert first.ranks[0].timings["imports_s"] < 0.5 * second.ranks[0].timings["imports_s"]
    for a, b in zip(first.ranks, second.ranks, strict=True):
        assert (a.model_state_bytes, a.activation_bytes) == (b.model_state_bytes, b.activation_bytes)


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_a_run_stopped_early_keeps_its_partial_steps_and_leaves_no_rank_behind(
    request, tmp_path: Path, launcher: str
) -> None:
    spec = run_spec(2)
    spec.steps = 50  # far more than it will run
    seen: list[list[float]] = []

    def on_step(times: list[float]) -> bool:
        seen.append(times)
        return len(times) >= 2

    run_dir = tmp_path / f"stopped-{uuid.uuid4().hex}"
    if launcher == "ray":
        request.getfixturevalue("local_ray")
        from tuner.measure.driver.ray_launcher import launch_ray

        result = launch_ray(spec, timeout=300, on_step=on_step)
    else:
        result = launch_local(spec, timeout=300, on_step=on_step, keep_dir=run_dir)
    assert result.status == "ok" and result.stopped_early, result.error
    assert {rank.exception_type for rank in result.ranks} == {STOPPED_EARLY}
    # rank 0 was seen at 2 steps; a peer is stopped within one step of it (each step's all-reduce waits for both),
    # possibly before it wrote the step it had just finished
    first = len(result.ranks[0].step_times)
    assert 2 <= first < 50 and all(first - 1 <= len(rank.step_times) <= first + 1 for rank in result.ranks)
    assert seen[-1] == result.ranks[0].step_times[: len(seen[-1])] and len(seen[-1]) >= 2
    assert result.tokens_per_s > 0
    assert set(COST_PHASES) <= set(result.cost)  # phases up to the timed steps, then the steps it finished
    assert result.cost["timed_s"] >= max(sum(rank.step_times) for rank in result.ranks) * 0.99
    assert all(isinstance(threads, int) for threads in result.launch["threads_per_rank"])  # what it was measured in
    time.sleep(0.5)
    assert leftover_processes(str(run_dir)) == []  # (on Ray the run dirs are the actors' own)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    from tuner.measure.driver.ray_launcher import ensure_ray

    ensure_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def test_ensure_ray_starts_its_own_ray_whatever_cluster_ray_recorded() -> None:
    """``ray.init()`` joins the cluster recorded in ``ray_current_cluster`` (the last ``ray start`` or test
    ``Cluster``, maybe stale or another process's) and then refuses ``num_cpus``; with no address ``ensure_ray``
    starts a private Ray instead."""
    pytest.importorskip("ray")
    temp = Path(tempfile.mkdtemp(prefix="dstune-ray-"))  # short: Ray's socket paths live under it
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # nothing listens there
        env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
        root = str(Path(__file__).resolve().parents[2])
        env.update(RAY_TMPDIR=str(temp), PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])))
        code = (
            "import ray\nfrom tuner.measure.driver.ray_launcher import ensure_ray\n"
            "ensure_ray(num_cpus=1)\nprint(ray.get_runtime_context().gcs_address)"
        )
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split()[-1] != "127.0.0.1:1"
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("world", [1, 2])
def test_ray_launcher_measures(local_ray, world: int) -> None:
    from tuner.measure.driver.ray_launcher import launch_ray

    assert_ok(launch_ray(run_spec(world), timeout=300), world)


def test_ray_launcher_reports_a_crash(local_ray) -> None:
    from tuner.measure.driver.ray_launcher import launch_ray

    entry = [sys.executable, str(FAULT_RANK), "crash", "1", "unused"]
    result = launch_ray(run_spec(2), timeout=300, entry=entry)
    assert result.status == "error" and result.exception_type == "builtins.ZeroDivisionError"


def test_out_of_memory_is_classified(tmp_path) -> None:
    # a reduce bucket of 1e9 elements (4 GB in fp32, 2 GB in 16 bits) is allocated whole at ZeRO-3's init: past
    # the 2 GiB cap whatever else the rank holds (threads' arenas differ with OMP_NUM_THREADS)
    spec = run_spec(1, zero={"stage": 3, "reduce_bucket_size": 10**9}, gradient_accumulation_steps=1)
    result = launch_local(spec, timeout=300, memory_cap=2 * 2**30)
    assert result.status == "oom", result.error
    assert "DefaultCPUAllocator" in result.error


def test_invalid_config_reports_deepspeeds_message() -> None:
    result = launch_local(run_spec(2, zero={"stage": 2, "reduce_bucket_sise": 5}), timeout=300)
    assert result.status == "invalid_config"
    assert "reduce_bucket_sise" in result.error
    mismatch = launch_local(run_spec(2, train_batch_size=7), timeout=300)
    assert mismatch.status == "invalid_config" and "train_batch_size" in mismatch.error


def test_crashing_rank_is_an_error_and_peers_stop() -> None:
    entry = [sys.executable, str(FAULT_RANK), "crash", "1", "unused"]
    result = launch_local(run_spec(2), timeout=300, entry=entry)
    assert result.status == "error"
    assert result.exception_type == "builtins.ZeroDivisionError"
    assert "injected crash" in result.error


def test_rank_dying_without_report_is_an_error() -> None:
    entry = [sys.executable, str(FAULT_RANK), "exit", "1", "unused"]
    result = launch_local(run_spec(2), timeout=300, entry=entry)
    assert result.status == "error" and "exited with code 3" in result.error
    assert result.ranks[0].exception_type == PEER_KILLED or result.ranks[0].status == "error"


def test_hanging_rank_is_killed_at_the_timeout_with_no_orphans(tmp_path: Path) -> None:
    """The run is given 10 s first (its forked ranks start in seconds on a quiet host), then the 25 s it always had,
    and longer while the rank had not reached its hanging step (a loaded host, a fork server still importing)."""
    marker = f"dstune-orphan-{uuid.uuid4().hex}"
    entry = [sys.executable, str(FAULT_RANK), "hang", "1", marker]
    for timeout in (10, 25, 60, 120):
        run_dir = tmp_path / f"timeout-{timeout}"
        started = time.monotonic()
        result = launch_local(run_spec(2), timeout=timeout, entry=entry, keep_dir=run_dir)
        if (run_dir / f"{HUNG}1").exists():
            break
    assert (run_dir / f"{HUNG}1").exists(), f"rank 1 never reached its hanging step: {result.error}"
    assert result.status == "timeout"
    assert time.monotonic() - started < timeout + 15
    time.sleep(0.5)
    assert leftover_processes(marker) == []


@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_cancel_kills_every_rank_at_once(request, launcher: str) -> None:
    """A stopped study's run: rank 1 hangs mid-training (rank 0 waits in its collective); setting ``cancel`` kills
    both ranks and the hanging rank's child at once, long before the timeout, and the run says Cancelled."""
    marker = f"dstune-cancel-{uuid.uuid4().hex}"
    entry = [sys.executable, str(FAULT_RANK), "hang", "1", marker]
    cancel = threading.Event()
    if launcher == "ray":
        request.getfixturevalue("local_ray")
        from tuner.measure.driver.ray_launcher import launch_ray as launch
    else:
        launch = launch_local
    outcome: list = []
    thread = threading.Thread(
        target=lambda: outcome.append(launch(run_spec(2), timeout=300, entry=entry, cancel=cancel))
    )
    thread.start()
    deadline = time.monotonic() + 120
    while not leftover_processes(marker):  # the hanging rank reached its first training step
        assert time.monotonic() < deadline and thread.is_alive(), "the run never reached training"
        time.sleep(0.2)
    cancelled_at = time.monotonic()
    cancel.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert time.monotonic() - cancelled_at < 15
    result = outcome[0]
    assert result.status == "error" and result.exception_type == CANCELLED, result.error
    assert {rank.exception_type for rank in result.ranks} == {CANCELLED}
    time.sleep(0.5)
    assert leftover_processes(marker) == []


def test_transformers_model_from_config_trains() -> None:
    """A transformers model (``implementation="transformers"``): the Hugging Face model built ``from_config``
    (random weights, no download)."""
    import json

    from tuner.workload import preset_config

    spec = run_spec(1)
    model = dict(spec.workload["model"], implementation="transformers")
    spec.workload = dict(spec.workload, model=dict(model, hf_config=json.dumps(preset_config("tiny-gpt2"))))
    assert_ok(launch_local(spec, timeout=300), 1)


def test_stale_build_locks_are_cleared(tmp_path, monkeypatch) -> None:
    import os

    from tuner.measure.rank.training import clear_stale_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale, fresh = tmp_path / "py311_cpu" / "fused_adam" / "lock", tmp_path / "py311_cpu" / "cpu_adam" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir(parents=True)
        lock.write_text("")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    (stale.parent / "fused_adam.o").write_text("half a build")
    assert clear_stale_build_locks() == [stale]
    assert fresh.exists() and not stale.parent.exists()


def test_local_launcher_gives_each_rank_torchruns_environment(tmp_path) -> None:
    """``--gpus 2 --nodes 2`` on this machine: the same variables a Ray job's ranks get, node by node."""
    import json
    import os
    import socket

    spec = run_spec(4)
    spec.workload["cluster"].update(gpus_per_node=2, nodes=2)
    entry = [sys.executable, str(Path(__file__).with_name("env_rank.py")), str(tmp_path)]
    result = launch_local(spec, timeout=120, entry=entry)
    assert result.status == "ok", result.error
    for rank in range(4):
        env = json.loads((tmp_path / f"env-{rank}.json").read_text())
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == (
            str(rank),
            "4",
            str(rank % 2),
            "2",
            str(rank // 2),
        )
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["CUDA_VISIBLE_DEVICES"] == os.environ.get(
            "CUDA_VISIBLE_DEVICES"
        )
        left = Path("/dev/shm") / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{env['MASTER_PORT']}_{rank}"
        assert not left.exists()  # the run's shm segments went with its ranks
    assert [(r.node_id, r.hostname, r.local_rank) for r in result.ranks] == [
        (None, socket.gethostname(), rank % 2) for rank in range(4)
    ]
    spec.device = "cuda"
    refused = launch_local(spec, timeout=120, entry=entry)
    assert refused.status == "error" and refused.exception_type == "InvalidLayout", refused.error
