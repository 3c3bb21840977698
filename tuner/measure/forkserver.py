"""Rank processes forked from a per-node server that imported torch, DeepSpeed and the runner once.

A fresh rank spends seconds importing torch, DeepSpeed, transformers and torch's compiler stack before it measures
anything (``imports_s`` in a trial's cost breakdown). A fork server pays that once per node: the first launcher on a
node starts ``python -m tuner.measure.forkserver SOCKET`` detached, the server imports everything a rank needs
(:data:`PRELOAD`, plus the modelling module a run names), moves what it imported to the collector's permanent
generation, and then forks one child per rank it is asked for. Each child becomes the rank the launcher would have
started: a new session (the launcher kills its process group), the rank's environment, working folder, log and
address-space limit, ``PR_SET_PDEATHSIG`` tied to the server, then the entry's module or script run as ``__main__``.

Nothing of one run reaches the next: the server never builds a model, touches a tensor or initialises CUDA (on a
GPU node it checks that a forked child can still allocate on a GPU, and refuses to serve otherwise: the launcher
then spawns fresh ranks), and every rank is a fresh fork of that pristine process, so one trial's allocations,
process group or engine never exist in the next one's rank.

Launchers (the local one, and Ray's rank hosts on every node) share the node's server through a Unix socket under
the temporary folder, named by a key of the interpreter, the environment read at start-up (``PYTHONPATH``, the
allocator's and OpenMP's variables, ``LD_PRELOAD``, the accelerator...: a forked rank keeps the server's) and the
installed code (a changed dstune, torch or DeepSpeed gets a new server). A launcher that dies takes its ranks with
it, as with ``PR_SET_PDEATHSIG`` on a spawned rank: the server stops every rank started over a connection when it
closes (SIGTERM, then SIGKILL after :data:`TERM_GRACE_S`). The server exits after :data:`IDLE_S` seconds with no
connection and no rank (``DSTUNE_FORKSERVER_IDLE_S``).

A server that dies (killed, out of memory) takes its ranks with it (their death signal); one that stops answering
(stopped, hung) leaves them running. Either way a launcher's request fails (the connection closed, or no answer
within :data:`ANSWER_TIMEOUT_S`), and its ranks are watched through ``/proc`` from then on (:class:`ForkedProcess`
``lost``), so that the launcher classifies the run as lost infrastructure instead of blaming the config. A server that
stopped answering has its socket retired, so the next rank start gets a new server.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import gc
import hashlib
import importlib
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner import env
from tuner.measure.op_builds import use_environment_ninja

PRELOAD = (
    "torch",
    "deepspeed",
    "torch._dynamo",  # the compiler stack the first torch.optim optimizer loads
    "deepspeed.runtime.engine",
    "deepspeed.runtime.zero.stage_1_and_2",
    "deepspeed.runtime.zero.stage3",
    "deepspeed.ops.adam",
    "transformers",
    "tuner.measure.runner",
    "tuner.measure.birth",
    "tuner.measure.models",
    "tuner.measure.memory_probe",
    "tuner.measure.lean",
)
IDLE_S = env.current().forkserver_idle_s
START_TIMEOUT_S = 300.0  # importing torch and DeepSpeed on a loaded 2-core host
PR_SET_PDEATHSIG = 1
TERM_GRACE_S = 3.0  # between SIGTERM and SIGKILL for the ranks of a launcher that went away
# Variables read when a process starts or imports (the allocator, the loader, Python, OpenMP/BLAS, DeepSpeed's
# accelerator): a forked rank keeps the server's, so servers are keyed by them. Per-rank variables are not among them.
KEY_VARIABLES = ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR", "LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES")
KEY_PREFIXES = ("PYTHON", "MALLOC_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
ARGV_ROOM, ENV_ROOM = 2048, 32768  # bytes the server's command line and environment reserve for its ranks' own
ROOM_VARIABLE = "DSTUNE_FORKSERVER_ROOM"
STAT_ARG_START = 48  # /proc/self/stat's fields (proc(5)): where the command line and the environment lie
STAT_START_TIME, STAT_EXIT_CODE = 22, 52  # /proc/PID/stat's fields (proc(5)): start time, a zombie's wait status
ANSWER_TIMEOUT_S = 30.0  # a server silent this long on a poll is stopped or hung (it answers in milliseconds)
START_ANSWER_TIMEOUT_S = 120.0  # a start may first import a model's module (seconds on a loaded host)


class ForkServerUnavailable(RuntimeError):
    """The node's fork server could not be started or refused to serve (the launcher then spawns ranks)."""


def server_key(env: Mapping[str, str] | None = None) -> str:
    """A short hash of what a preloaded server depends on: the interpreter, the variables read at start-up or import
    (:data:`KEY_VARIABLES`, :data:`KEY_PREFIXES`: a rank asking with other values gets a server started with them),
    and the installed code (dstune's own files' modification times; torch, DeepSpeed and transformers versions)."""
    env = os.environ if env is None else env
    digest = hashlib.sha256(_installed_code().encode())
    for name in sorted(n for n in env if n in KEY_VARIABLES or n.startswith(KEY_PREFIXES)):
        digest.update(f"{name}={env[name]}\n".encode())
    return digest.hexdigest()[:16]


@functools.cache
def _installed_code() -> str:
    """The interpreter and the code this process runs (read once: it does not change under a running launcher,
    and every rank start asks for the key)."""
    from importlib import metadata

    digest = hashlib.sha256(sys.executable.encode())
    for dist in ("torch", "deepspeed", "transformers"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            digest.update(f"{dist}={metadata.version(dist)}\n".encode())
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(f"{path}:{path.stat().st_mtime_ns}\n".encode())
    return digest.hexdigest()


def socket_path(key: str) -> Path:
    """The node's socket for ``key``: a private folder of this user under the temporary folder (short, as Unix
    socket paths must be)."""
    folder = Path(tempfile.gettempdir()) / f"dstune-fork-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    status = folder.lstat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077 or not folder.is_dir() or folder.is_symlink():
        raise ForkServerUnavailable(f"{folder} is not a private folder of this user: ranks are not forked through it")
    return folder / f"{key}.sock"


def exit_code(status: int) -> int:
    """A ``waitpid`` status as ``subprocess.Popen.returncode`` says it (a signal as its negative number)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# -- the client side: what a launcher holds --------------------------------------------------------------------


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
        self.path, self.inode = path, _inode(path)
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
                self.sock.sendall(json.dumps(message).encode() + b"\n")
                line = self.reader.readline()
            except TimeoutError:
                self.stalled = True
                raise ForkServerUnavailable(f"the fork server did not answer within {timeout:.0f} s") from None
            except OSError as error:
                raise ForkServerUnavailable(f"the fork server's connection broke: {error}") from error
        if not line:
            raise ForkServerUnavailable("the fork server closed the connection")
        answer: dict[str, Any] = json.loads(line)
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


def _inode(path: Path | None) -> int | None:
    try:
        return None if path is None else path.stat().st_ino
    except OSError:
        return None


def _retire(path: Path, inode: int | None) -> None:
    """Unlink the socket of a server that stopped answering, unless another launcher did (or a new server took the
    name) already: under the start lock, so no server is starting meanwhile. The stopped server is left as it is."""
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if inode is not None and _inode(path) == inode:
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
    path = socket_path(key)
    sock = _connect(path)
    if sock is not None:
        return sock
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
            raise ForkServerUnavailable(f"the fork server did not listen within {START_TIMEOUT_S:.0f} s") from None
        sock = _connect(path) if code == 0 else None
        if sock is None:
            tail = log.read_text(errors="replace")[-1500:]
            raise ForkServerUnavailable(f"the fork server did not start (code {code}):\n{tail}")
        return sock


# -- the server side -------------------------------------------------------------------------------------------


OP_BUILDERS = {
    "deepspeed_shm_comm": "ShareMemCommBuilder",
    "fused_adam": "FusedAdamBuilder",
    "cpu_adam": "CPUAdamBuilder",
}
_settled_ops: set[str] = set()  # loaded, or built but not loadable here: never tried again


def _load_built_ops() -> None:
    """Load DeepSpeed's CPU ops that are already built (never build one here: that is the runs' announced work).

    A rank loading an op takes torch's build lock for its up-to-date check; a rank killed inside that window
    leaves the lock behind and every later rank waits on it. Loaded here, DeepSpeed's builders answer the ranks
    from their cache (``OpBuilder._loaded_ops``) and no rank takes the lock. CPU only: GPU nodes keep their ops to
    the ranks, so that nothing CUDA-linked is loaded before the fork.
    """
    from tuner.measure.op_builds import extensions_dir, missing_ops

    if len(_settled_ops) == len(OP_BUILDERS) or "deepspeed" not in sys.modules:
        return
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        _settled_ops.update(OP_BUILDERS)
        return
    unsettled = [name for name in OP_BUILDERS if name not in _settled_ops]
    built = set(unsettled) - set(missing_ops(unsettled, extensions_dir(), _prebuilt_ops()))
    for name in sorted(built):
        _settled_ops.add(name)
        with contextlib.suppress(Exception):  # an op this host cannot load: the ranks say why when they need it
            get_accelerator().create_op_builder(OP_BUILDERS[name]).load(verbose=False)


@functools.cache
def _prebuilt_ops() -> frozenset[str]:
    from tuner.measure.op_builds import prebuilt_ops

    return frozenset(prebuilt_ops())


def _preload(modules: Sequence[str]) -> None:
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
            elif time.monotonic() - self.idle_since > IDLE_S:
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
                answer = self._answer(conn, json.loads(line))
            except Exception as error:  # a bad request is answered, never the end of the node's server
                answer = {"error": f"{type(error).__name__}: {error}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer).encode() + b"\n")

    def _answer(self, conn: socket.socket, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        if op == "start":
            _preload(message.get("preload", ()))
            _load_built_ops()
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
        argv = [str(arg) for arg in message["argv"]]
        if len(argv) < 2 or argv[0] != sys.executable:
            raise ValueError(f"the fork server runs {sys.executable} entries, not {argv[:1]}")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            self._become_rank(message)
            code = _run_entry(argv)
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _become_rank(self, message: dict[str, Any]) -> None:
        """In the child: leave the server's sockets, session and signals behind and take on the rank's process."""
        server_pid = os.getppid()
        for conn in [self.listener, *self.buffers]:
            conn.close()
        self.selector.close()
        os.setsid()
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server_pid:  # the server died before the death signal was armed
            os._exit(1)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        if message.get("memory_cap"):
            cap = int(message["memory_cap"])
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        os.chdir(message["cwd"])
        os.environ.clear()  # no libc pointer into the inherited environment's memory is left ...
        os.environ.update(message["env"])
        retitle(message["argv"], message["env"])  # ... so it can say the rank's own
        sink = os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        os.close(sink)
        os.close(null)


def retitle(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Make ``/proc/self/cmdline`` and ``/proc/self/environ`` (what ``ps``, ``psutil`` and an operator see) say this
    rank's command and environment instead of the server's, by writing them over the server's own, which the
    starter padded (:data:`ARGV_ROOM`, :data:`ENV_ROOM`); what does not fit is left out of that view only."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # fields from the third on
    arg_start, arg_end, env_start, env_end = (int(fields[STAT_ARG_START - 3 + i]) for i in range(4))
    _overwrite(arg_start, arg_end, [arg.encode() for arg in argv])
    _overwrite(env_start, env_end, [f"{key}={value}".encode() for key, value in env.items()])


def _overwrite(start: int, end: int, items: list[bytes]) -> None:
    room = end - start
    data = b""
    for item in items:
        if len(data) + len(item) + 2 > room:
            break
        data += item + b"\0"
    ctypes.memmove(start, data.ljust(room, b"\0"), room)


def _run_entry(argv: list[str]) -> int:
    """Run ``python -m MODULE ARGS``, ``python -c CODE ARGS`` or ``python SCRIPT ARGS`` in this process as
    ``__main__``; its exit code."""
    import runpy
    import warnings

    try:
        if argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            sys.path[0] = os.getcwd()
            with warnings.catch_warnings():  # the module was preloaded: running it again as __main__ is the point
                warnings.simplefilter("ignore", RuntimeWarning)
                runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        elif argv[1] == "-c":
            sys.argv = ["-c", *argv[3:]]
            sys.path[0] = ""
            exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = argv[1:]
            sys.path[0] = str(Path(argv[1]).resolve().parent)
            runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tuner.measure.forkserver SOCKET``: start the node's server as a daemon (a grandchild, so that no
    launcher's process tree, such as a Ray worker's, takes it down with it) and exit 0 once it listens."""
    path = Path((argv or sys.argv[1:])[0])
    ready_r, ready_w = os.pipe()
    if os.fork():
        os.close(ready_w)
        return 0 if os.read(ready_r, 16) == b"ready" else 3
    os.close(ready_r)
    os.setsid()
    code = 1
    try:
        code = _daemon(path, ready_w)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _forked_child_uses_cuda() -> bool:
    """Whether a child forked now can allocate on a GPU: the self-test of a server on a GPU node, since an import
    that initialised the CUDA driver (not only torch's context) would leave every forked rank unable to."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return exit_code(status) == 0


def _daemon(path: Path, ready: int) -> int:
    started = time.monotonic()
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # torch.cuda.is_available() without initialising the driver
    _preload(PRELOAD)
    with contextlib.suppress(Exception):
        from tuner.measure.lean import cache_cpu_info

        cache_cpu_info()
    use_environment_ninja()
    _load_built_ops()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        print("CUDA was initialised while preloading: forked ranks could not use it", file=sys.stderr)
        return 3
    if torch is not None and torch.cuda.device_count() > 0 and not _forked_child_uses_cuda():
        print("a child forked after the imports cannot use CUDA (the driver was initialised)", file=sys.stderr)
        return 3
    gc.collect()
    gc.freeze()  # what the imports made is never garbage: the ranks' collections skip it (tuner.measure.lean)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead server's socket (the starting launcher holds the start lock)
    listener.bind(str(path))
    inode = _inode(path)
    listener.listen(64)
    print(f"fork server {os.getpid()} preloaded in {time.monotonic() - started:.1f} s, listening", flush=True)
    os.write(ready, b"ready")
    os.close(ready)
    try:
        Server(listener).serve()
    finally:
        if _inode(path) == inode:  # still ours (a launcher retires the socket of a server that stopped answering)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # first: a launcher connecting from now on starts a new server ...
        listener.close()  # ... and one still in the backlog reads EOF and retries
    return 0


if __name__ == "__main__":
    sys.exit(main())
