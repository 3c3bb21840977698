"""The real ``dstune serve`` process: a hostile pattern or a peft adapter never reaches torch or a
backtracking regex in the server (``/healthz`` answers within 1 s meanwhile, no torch mapped into the server), and
no process it started outlives it, whether it is stopped with SIGTERM or killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

psutil = pytest.importorskip("psutil")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 512, "n_positions": 128}
HOSTILE = [
    {"workload": {"model": "tiny-gpt2", "freeze": "(.|.)*z"}},
    {"workload": {"config": TINY, "seq_len": 64, "device": "cpu", "freeze": "(.|.)*z"}},
    {"workload": {"config": TINY, "seq_len": 64, "device": "cpu", "peft": {"r": 4, "target_modules": "(.|.)*z"}}},
    {"workload": {"config": TINY, "seq_len": 64, "device": "cpu", "peft": {"r": 4, "target_modules": ["c_attn"]}}},
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    tmp: Path, storage: str | None = None, profiles: Path | None = None, **settings: str
) -> tuple[subprocess.Popen[str], str]:
    """A real ``dstune serve`` on a free port with a fresh profile cache (new profiles go to its worker process), or
    the cache ``profiles``; ``settings``: more ``DSTUNE_*`` variables."""
    port = _free_port()
    dstune = str(Path(sys.executable).with_name("dstune"))
    env = {**os.environ, "DSTUNE_API_TOKEN": "t0ken", "DSTUNE_PROFILE_CACHE": str(profiles or tmp / "profiles")}
    env.update(settings)
    command = [dstune, "serve", "--storage", storage or f"sqlite:///{tmp / 'dstune.db'}", "--port", str(port)]
    server = subprocess.Popen([*command, "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return server, base
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.2)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process, base = start_server(tmp_path)
    yield process, base
    if process.poll() is None:
        process.kill()
        process.wait()


def _healthz_s(base: str) -> float:
    started = time.monotonic()
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    return time.monotonic() - started


def _exercise(base: str) -> list[int]:
    """Send the hostile requests, each while checking /healthz stays quick; their answers' status codes."""
    codes = []
    for body in HOSTILE:
        started = time.monotonic()
        answer = httpx.post(f"{base}/v1/estimate", json=body, timeout=60)
        assert time.monotonic() - started < 30
        assert answer.status_code in (200, 422, 503), answer.text
        codes.append(answer.status_code)
        assert _healthz_s(base) < 1.0
    return codes


def _torch_mapped(process: Any) -> bool:
    return any("torch" in Path(item.path).name or "/torch/" in item.path for item in process.memory_maps())


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_nothing_outlives_the_server(server: tuple[subprocess.Popen[str], str], stop: int) -> None:
    process, base = server
    codes = _exercise(base)
    parent = psutil.Process(process.pid)
    deadline = time.monotonic() + 60
    while not parent.children(recursive=True):  # the profiling worker, spawned by the first new profile
        assert time.monotonic() < deadline, f"no profiling worker was started ({codes})"
        time.sleep(0.2)
    children = parent.children(recursive=True)
    assert not _torch_mapped(parent), "torch was imported into the server process"
    process.send_signal(stop)
    process.wait(timeout=30)
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind after {signal.Signals(stop).name}: {[p.pid for p in alive]}"
