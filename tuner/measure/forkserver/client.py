"""What a launcher holds: its connection to the node's fork server (started on first use) and the ranks it forked.

A server that dies (killed, out of memory) takes its ranks with it (their death signal); one that stops answering
(stopped, hung) leaves them running. Either way a launcher's request fails (the connection closed, or no answer
within :data:`ANSWER_TIMEOUT_S`), and its ranks are watched through ``/proc`` from then on (:class:`ForkedProcess`
``lost``), so that the launcher classifies the run as lost infrastructure instead of blaming the config. A server that
stopped answering has its socket retired, so the next rank start gets a new server.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.measure.forkserver.protocol import (
    ARGV_ROOM,
    ENV_ROOM,
    ROOM_VARIABLE,
    ForkServerUnavailable,
    decode,
    encode,
    exit_code,
    server_key,
    socket_inode,
    socket_path,
)

START_TIMEOUT_S = 300.0  # importing torch and DeepSpeed on a loaded 2-core host
# a server that failed to start (on a GPU node: one whose forked children could not use CUDA) is not started again
# for this long: each try costs its whole preload, and the ranks of a run start one after another, rank 0 waiting for
# the others in its rendezvous
NO_RESTART_S = 300.0
_failed_starts: dict[str, tuple[float, str]] = {}  # server key -> (when its start failed, why)
STAT_START_TIME, STAT_EXIT_CODE = 22, 52  # /proc/PID/stat's fields (proc(5)): start time, a zombie's wait status
ANSWER_TIMEOUT_S = 30.0  # a server silent this long on a poll is stopped or hung (it answers in milliseconds)
START_ANSWER_TIMEOUT_S = 120.0  # a start may first import a model's module (seconds on a loaded host)


class ForkedProcess:
    """A rank forked by the server, with the part of ``subprocess.Popen``'s interface the launcher uses.

    Once the server cannot answer (:class:`ForkServerUnavailable`), ``lost`` says why and the rank is watched through
    ``/proc`` instead: gone (its death signal killed it when the server died) reads as SIGKILL, a zombie (of a stopped
    server) as its own exit status."""

    def __init__(self, client: ForkClient, pid: int) -> None:
        self.client, self.pid = client, pid
        self.returncode: int | None = None
        self.lost: str | None = None
        self.started = _proc_stat(pid, STAT_START_TIME)  # tells this rank from a later process given its pid

    def poll(self) -> int | None:
        """The exit code once the rank ended (the server reaped it), else None."""
        if self.returncode is None and self.lost is None:
            try:
                self.returncode = self.client.returncode(self.pid)
            except ForkServerUnavailable as error:
                self.lost = str(error)
                forget_client(self.client)
        if self.returncode is None and self.lost is not None:
            self.returncode = _orphan_returncode(self.pid, self.started)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the rank to end; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code


def _proc_stat(pid: int, field: int) -> str | None:
    """Field ``field`` (1-based, proc(5)) of ``/proc/PID/stat``, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # from the third field on (the command may hold spaces)
    return fields[field - 3] if len(fields) > field - 3 else None


def _orphan_returncode(pid: int, started: str | None) -> int | None:
    """How a rank whose server no longer answers ended: None while it runs, its exit code as a zombie, SIGKILL (its
    death signal) once it is gone or its pid belongs to a later process."""
    state = _proc_stat(pid, 3)
    if state is None or _proc_stat(pid, STAT_START_TIME) != started:
        return -signal.SIGKILL
    if state in ("Z", "X"):
        status = _proc_stat(pid, STAT_EXIT_CODE)
        return exit_code(int(status)) if status is not None and status.isdigit() else -signal.SIGKILL
    return None


class ForkClient:
    """One launcher's connection to its node's fork server (thread-safe: one request at a time). ``path`` and
    ``inode`` name the socket it connected through, to retire it if the server stops answering."""

    def __init__(self, sock: socket.socket, path: Path | None = None) -> None:
        self.sock, self.lock = sock, threading.Lock()
        self.reader = sock.makefile("rb")
        self.path, self.inode = path, socket_inode(path)
        self.stalled = False

    def request(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request and read its answer; :class:`ForkServerUnavailable` if the server is gone or gives no
        answer within ``timeout`` seconds (default :data:`ANSWER_TIMEOUT_S`; ``stalled``: the connection is of no
        further use)."""
        timeout = ANSWER_TIMEOUT_S if timeout is None else timeout
        with self.lock:
            if self.stalled:
                raise ForkServerUnavailable("the fork server stopped answering")
            try:
                self.sock.settimeout(timeout)
                self.sock.sendall(encode(message))
                line = self.reader.readline()
            except TimeoutError:
                self.stalled = True
                raise ForkServerUnavailable(f"the fork server did not answer within {timeout:.0f} s") from None
            except OSError as error:
                raise ForkServerUnavailable(f"the fork server's connection broke: {error}") from error
        if not line:
            raise ForkServerUnavailable("the fork server closed the connection")
        answer = decode(line)
        if "error" in answer:
            raise ForkServerUnavailable(answer["error"])
        return answer

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        memory_cap: int | None = None,
        preload: Sequence[str] = (),
    ) -> ForkedProcess:
        """Fork a rank running ``argv`` (``python -m MODULE ...``, ``-c CODE`` or ``SCRIPT ...``) with ``env``, its
        output in ``log``; ``preload`` names modules the server imports first (and keeps for later ranks)."""
        answer = self.request(
            {
                "op": "start",
                "argv": list(argv),
                "env": dict(env),
                "log": str(log),
                "cwd": os.getcwd(),
                "memory_cap": memory_cap,
                "preload": list(preload),
            },
            timeout=max(START_ANSWER_TIMEOUT_S, ANSWER_TIMEOUT_S),
        )
        return ForkedProcess(self, int(answer["pid"]))

    def returncode(self, pid: int) -> int | None:
        code = self.request({"op": "poll", "pid": pid})["returncode"]
        return None if code is None else int(code)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


_clients: dict[str, ForkClient] = {}
_clients_lock = threading.Lock()


def node_client(env: Mapping[str, str] | None = None) -> ForkClient:
    """This process's connection to the node's fork server for ``env`` (started if none serves yet)."""
    key = server_key(env)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = ForkClient(_connect_or_start(key, env), socket_path(key))
        return client


def forget_client(client: ForkClient) -> None:
    """Drop a broken connection, so that the next :func:`node_client` connects (or starts a server) again; the
    socket of a server that stopped answering is retired, so that it is a new server."""
    with _clients_lock:
        for key, known in list(_clients.items()):
            if known is client:
                del _clients[key]
    client.close()
    if client.stalled and client.path is not None:
        _retire(client.path, client.inode)


def release_node_servers(timeout_s: float = 2.0) -> int:
    """This session is done with the node's fork servers: drop this process's connections and tell every server of
    this user on this node to leave once nobody uses it (a concurrent session keeps it until its launchers go; one
    starting later starts a new server). Returns how many servers were told; one that cannot be reached is skipped.
    """
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()
    try:
        folder = socket_path("release").parent
    except ForkServerUnavailable:
        return 0
    told = 0
    for path in sorted(folder.glob("*.sock")):
        sock = _connect(path)
        if sock is None:
            continue
        with contextlib.closing(sock), contextlib.suppress(OSError, ValueError):
            sock.settimeout(timeout_s)
            sock.sendall(encode({"op": "release"}))
            if "pid" in decode(sock.makefile("rb").readline()):
                told += 1
    return told


def _retire(path: Path, inode: int | None) -> None:
    """Unlink the socket of a server that stopped answering, unless another launcher did (or a new server took the
    name) already: under the start lock, so no server is starting meanwhile. The stopped server is left as it is."""
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if inode is not None and socket_inode(path) == inode:
            path.unlink()


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def _connect_or_start(key: str, env: Mapping[str, str] | None) -> socket.socket:
    """A connection to the node's server for ``key``, started first (by one launcher, under the start lock) when
    none listens: ``python -m tuner.measure.forkserver`` with its command line and environment padded for its ranks'
    own (:func:`tuner.measure.rank.forked.retitle`)."""
    path = socket_path(key)
    sock = _connect(path)
    if sock is not None:
        return sock
    failed = _failed_starts.get(key)
    if failed is not None and time.monotonic() - failed[0] < NO_RESTART_S:
        raise ForkServerUnavailable(f"{failed[1]} (not started again for {NO_RESTART_S:.0f} s)")
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one launcher starts the server; the others wait and connect
        sock = _connect(path)
        if sock is not None:
            return sock
        log = path.with_suffix(".log")
        with log.open("ab") as sink:
            starter = subprocess.Popen(
                [sys.executable, "-m", "tuner.measure.forkserver", str(path), " " * ARGV_ROOM],
                env={**(os.environ if env is None else env), ROOM_VARIABLE: " " * ENV_ROOM},
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:
            code = starter.wait(timeout=START_TIMEOUT_S)  # it exits once its daemon listens (or failed to)
        except subprocess.TimeoutExpired:
            starter.kill()
            _failed_starts[key] = (time.monotonic(), f"the fork server did not listen within {START_TIMEOUT_S:.0f} s")
            raise ForkServerUnavailable(_failed_starts[key][1]) from None
        sock = _connect(path) if code == 0 else None
        if sock is None:
            why = f"the fork server did not start (code {code}):\n{log.read_text(errors='replace')[-1500:]}"
            _failed_starts[key] = (time.monotonic(), why)
            raise ForkServerUnavailable(why)
        _failed_starts.pop(key, None)
        return sock
