"""``dstune measure`` end to end: a real DeepSpeed run on CPU through the console script."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.deepspeed

DSTUNE = str(Path(sys.executable).with_name("dstune"))
TINY = ["--model", "tiny-gpt2", "--seq-len", "64", "--micro-batch", "2", "--device", "cpu"]


def dstune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([DSTUNE, *args], capture_output=True, text=True, timeout=600, env=env)


def fork_servers_marked(marker: str) -> list[psutil.Process]:
    """The fork servers started with ``DSTUNE_TEST_MARKER=marker`` in their environment."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            server = "tuner.measure.forkserver" in " ".join(process.info["cmdline"] or ())
            if server and process.environ().get("PYTHONDSTUNE_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_measure_json_contract(tmp_path) -> None:
    """The JSON contract; and the node's fork server the command started leaves when the command ends (its own
    server: the marker, a ``PYTHON*`` variable, is part of the server's key), not after its idle timeout."""
    marker = str(tmp_path)
    env = dict(os.environ, PYTHONDSTUNE_TEST_MARKER=marker, DSTUNE_FORKSERVER_IDLE_S="900")
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}))
    args = ["--gpus", "2", "--stage", "2", "--warmup", "1", "--steps", "2", "--ds-config", str(config), "--json"]
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout_file, err.open("w") as stderr_file:
        command = subprocess.Popen([DSTUNE, "measure", *TINY, *args], stdout=stdout_file, stderr=stderr_file, env=env)
        served = False
        while command.poll() is None:  # the ranks are forked from a server of the command's own
            served = served or bool(fork_servers_marked(marker))
            time.sleep(0.5)
    assert command.returncode == 0, err.read_text()
    assert served, "no fork server served the command's ranks"
    deadline = time.monotonic() + 60  # it leaves once its last launcher is gone: well within a loaded minute
    while fork_servers_marked(marker):
        assert time.monotonic() < deadline, "the command's fork server outlived it"
        time.sleep(0.2)
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["error"] is None
    assert result["over_memory"] is None  # within the host's share per rank, the default --gpu-memory on CPU ranks
    assert result["tokens_per_s"] > 0 and result["samples_per_s"] > 0
    assert set(result["step_time_s"]) == {"p50", "p90"}
    assert result["tflops_per_device"] > 0
    assert len(result["peak_bytes_per_rank"]) == 2
    ranks = result["ranks"]  # the rank report: where each rank ran, its peaks and step times
    assert [(r["rank"], r["local_rank"], r["node_id"], r["status"]) for r in ranks] == [
        (0, 0, None, "ok"),
        (1, 1, None, "ok"),
    ]
    assert all(r["hostname"] and "peak_bytes" in r and r["peak_rss_bytes"] > 0 for r in ranks)  # warm-up 1: no probe
    assert all(len(r["step_times"]) == 2 for r in ranks)
    assert result["estimate"]["world_size"] == 2 and result["estimate"]["per_gpu"]["total"] > 0


def test_measure_reports_invalid_config_with_exit_1(tmp_path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 3}))
    done = dstune("measure", *TINY, "--ds-config", str(config), "--steps", "1", "--json")
    assert done.returncode == 2  # our own validation catches it before any rank starts
    assert "train_batch_size" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--params", "1e9"], "params"),
        (["--steps", "0"], "steps"),
        (["--memory-cap", "lots"], "memory-cap"),
        (["--launcher", "slurm"], "launcher"),
    ],
)
def test_measure_bad_input_exits_2(args: list[str], field: str) -> None:
    base = [a for a in TINY if a not in ("--model", "tiny-gpt2")] if "--params" in args else TINY
    done = dstune("measure", *base, *args)
    assert done.returncode == 2 and field in done.stderr and "Traceback" not in done.stderr
