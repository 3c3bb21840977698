"""Shared tools of the fault-injection tests and ``bench/faults.py``: waiting on conditions, a private PostgreSQL
server that may be stopped and started at will, finding processes by a marker in their environment, and small jobs.

Every wait here is on a condition with a generous deadline, never on timing: the suite must pass on a loaded machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

MARKER_ENV = "DSTUNE_FAULT_MARKER"


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "a condition") -> Any:
    """Poll ``condition`` until it returns something true (returned), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def marked_processes(marker: str, *, exclude: int | None = None) -> list[Any]:
    """Live processes (zombies aside) whose environment carries ``DSTUNE_FAULT_MARKER=marker``."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid"]):
        if process.pid in (os.getpid(), exclude):
            continue
        try:
            if process.environ().get(MARKER_ENV) == marker and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def rank_processes(processes: list[Any]) -> list[Any]:
    """The measured-run ranks (``tuner.measure.rank.runner`` or the fault entry) among ``processes``."""
    out = []
    for process in processes:
        try:
            line = " ".join(process.cmdline())
        except Exception:  # gone meanwhile
            continue
        if "tuner.measure.rank.runner" in line or "fault_rank.py" in line:
            out.append(process)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return candidates[0] if candidates else None


class PrivatePostgres:
    """A throwaway PostgreSQL server of our own (own port and data folder), to stop and start mid-test: the shared
    test server is never restarted. Runs as the ``postgres`` user when we are root, as the server demands."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
        self.bin, self.port = bindir, free_port()
        self.data = Path(tempfile.mkdtemp(prefix="dstune-faults-pg-"))
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = '{self.data}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 50\n"
                "shared_buffers = 16MB\n"
            )

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=180)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", "120", "start")
        engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        try:
            wait_for(lambda: _connects(engine), 120, "the private PostgreSQL server to accept connections")
        finally:
            engine.dispose()

    def stop(self) -> None:
        """Stop the server (fast shutdown: sessions are terminated, as in a restart)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "120", "stop")

    def destroy(self) -> None:
        """Stop the server if it runs and remove its data folder."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.data, ignore_errors=True)


def _connects(engine: sa.Engine) -> bool:
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
        return True
    except sa.exc.OperationalError:
        return False


def pruned_job_request(study: str, trials: int) -> dict[str, Any]:
    """A real tuning job whose every config the estimator prunes (1 MiB of GPU memory): a real study, no runs."""
    from tuner.requests import JobRequest

    body = {
        "workload": {"model": "tiny-gpt2", "device": "cpu", "gpu_memory": "1MiB", "seq_len": 32},
        "study": study,
        "launcher": "local",
        "sampler": "random",
        "seed": 1,
        "global_batch": 8,
        "trials": trials,
    }
    return JobRequest.model_validate(body).model_dump(mode="json")
