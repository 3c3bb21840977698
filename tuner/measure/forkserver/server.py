"""The serving loop of a node's fork server: accept launchers, fork the ranks they ask for, reap them, answer their
exit codes, and stop the ranks of a launcher that went away.

A launcher that dies takes its ranks with it, as with ``PR_SET_PDEATHSIG`` on a spawned rank: the server stops every
rank started over a connection when it closes (SIGTERM, then SIGKILL after :data:`TERM_GRACE_S`). The server returns
after :data:`IDLE_S` seconds with no connection and no rank (``DSTUNE_FORKSERVER_IDLE_S``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from tuner import env
from tuner.measure.forkserver.protocol import decode, encode, exit_code
from tuner.measure.op_builds import OP_BUILDERS
from tuner.measure.rank.forked import run_rank

IDLE_S = env.current().forkserver_idle_s
TERM_GRACE_S = 3.0  # between SIGTERM and SIGKILL for the ranks of a launcher that went away


_settled_ops: set[str] = set()  # loaded, or built but not loadable here: never tried again


def load_built_ops() -> None:
    """Load DeepSpeed's CPU ops that are already built (never build one here: that is the runs' announced work).

    A rank loading an op takes torch's build lock for its up-to-date check; a rank killed inside that window
    leaves the lock behind and every later rank waits on it. Loaded here, DeepSpeed's builders answer the ranks
    from their cache (``OpBuilder._loaded_ops``) and no rank takes the lock. CPU only: GPU nodes keep their ops to
    the ranks, so that nothing CUDA-linked is loaded before the fork.
    """
    from tuner.measure.op_builds import extensions_dir, missing_ops
    from tuner.measure.rank.stale_builds import clear_stale_builds

    if len(_settled_ops) == len(OP_BUILDERS) or "deepspeed" not in sys.modules:
        return
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        _settled_ops.update(OP_BUILDERS)
        return
    unsettled = [name for name in OP_BUILDERS if name not in _settled_ops]
    clear_stale_builds(extensions_dir())  # a build killed midway left its lock: loading would wait on it forever
    built = set(unsettled) - set(missing_ops(unsettled, extensions_dir(), _prebuilt_ops()))
    for name in sorted(built):
        _settled_ops.add(name)
        with contextlib.suppress(Exception):  # an op this host cannot load: the ranks say why when they need it
            get_accelerator().create_op_builder(OP_BUILDERS[name]).load(verbose=False)


@functools.cache
def _prebuilt_ops() -> frozenset[str]:
    from tuner.measure.op_builds import prebuilt_ops

    return frozenset(prebuilt_ops())


def preload(modules: Sequence[str]) -> None:
    """Import the ``modules`` not imported yet: every rank forked from now on has them."""
    for name in modules:
        if name not in sys.modules:
            with contextlib.suppress(Exception):  # an optional module (transformers) or one a run names wrongly
                importlib.import_module(name)


class Server:
    """The serving loop: accepts launchers, forks ranks, reaps them and answers their exit codes."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.buffers: dict[socket.socket, bytes] = {}
        self.owner: dict[int, socket.socket] = {}  # running rank pid -> the connection that started it
        self.codes: dict[int, tuple[socket.socket, int]] = {}  # reaped rank -> (its launcher, exit code) until asked
        self.doomed: dict[int, float] = {}  # rank process group -> when it gets SIGKILL (its launcher is gone)
        self.idle_since = time.monotonic()
        self.released = False  # a session that used this server ended: leave as soon as nobody uses it

    def serve(self) -> None:
        while True:
            for selected, _ in self.selector.select(timeout=0.05):
                sock = selected.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    conn, _ = self.listener.accept()
                    self.buffers[conn] = b""
                    self.selector.register(conn, selectors.EVENT_READ)
                else:
                    self._read(sock)
            self._reap()
            self._kill_doomed()
            if self.buffers or self.owner or self.doomed:
                self.idle_since = time.monotonic()
            elif self.released or time.monotonic() - self.idle_since > IDLE_S:
                return

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        self.buffers[conn] += data
        while b"\n" in self.buffers[conn]:
            line, self.buffers[conn] = self.buffers[conn].split(b"\n", 1)
            try:
                answer = self._answer(conn, decode(line))
            except Exception as error:  # a bad request is answered, never the end of the node's server
                answer = {"error": f"{type(error).__name__}: {error}"}
            with contextlib.suppress(OSError):
                conn.sendall(encode(answer))

    def _answer(self, conn: socket.socket, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        if op == "start":
            preload(message.get("preload", ()))
            load_built_ops()
            pid = self._fork(message)
            self.owner[pid] = conn
            return {"pid": pid}
        if op == "poll":
            pid = int(message["pid"])
            self._reap()
            if pid in self.owner:
                return {"returncode": None}
            if pid in self.codes:
                return {"returncode": self.codes.pop(pid)[1]}
            raise ValueError(f"no rank {pid} of this launcher")
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "release":
            self.released = True
            return {"pid": os.getpid()}
        raise ValueError(f"unknown op {op!r}")

    def _drop(self, conn: socket.socket) -> None:
        """A launcher went away (closed or died): its ranks die with it."""
        self.selector.unregister(conn)
        self.buffers.pop(conn, None)
        conn.close()
        for pid, owner in list(self.owner.items()):
            if owner is conn:  # SIGTERM first: a rank unwinds (releasing torch's build lock), then SIGKILL
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
                self.doomed[pid] = time.monotonic() + TERM_GRACE_S
        for pid, (owner, _) in list(self.codes.items()):
            if owner is conn:
                del self.codes[pid]

    def _kill_doomed(self) -> None:
        now = time.monotonic()
        for pid, deadline in list(self.doomed.items()):
            if now >= deadline:  # the group, whether its leader is gone or not: what the rank started goes too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                del self.doomed[pid]

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            owner = self.owner.pop(pid, None)
            if owner is not None and owner in self.buffers:  # its launcher is still there to ask
                self.codes[pid] = (owner, exit_code(status))

    def _fork(self, message: dict[str, Any]) -> int:
        """Fork the rank ``message`` asks for (:mod:`tuner.measure.rank.forked`); its pid."""
        argv = [str(arg) for arg in message["argv"]]
        if len(argv) < 2 or argv[0] != sys.executable:
            raise ValueError(f"the fork server runs {sys.executable} entries, not {argv[:1]}")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        run_rank(message, argv, [self.listener, *self.buffers], self.selector)
