"""The node's fork server with real processes: a forked rank is the process a launcher would have spawned, and it
dies with the launcher that asked for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuner.measure.driver.processes import rank_preloads
from tuner.measure.forkserver import ForkServerUnavailable, node_client, server_key
from tuner.measure.run_protocol import RunSpec


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead


def wait_until(condition, deadline_s: float = 120.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_a_forked_rank_runs_its_script_with_its_environment_folder_and_log(tmp_path: Path) -> None:
    script = tmp_path / "entry.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            import torch  # preloaded by the server
            print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("DSTUNE_PROBE"), flush=True)
            print("session leader", os.getsid(0) == os.getpid(), file=sys.stderr)
            sys.exit(7)
            """
        )
    )
    client = node_client()
    env = dict(os.environ, DSTUNE_PROBE="rank-env")
    rank = client.start([sys.executable, str(script), "a", "b"], env, tmp_path / "rank.log")
    assert rank.wait(timeout=120) == 7
    log = (tmp_path / "rank.log").read_text()
    assert "argv ['a', 'b']" in log and f"cwd {os.getcwd()}" in log and "var rank-env" in log
    assert "session leader True" in log
    assert node_client() is client and client.request({"op": "ping"})["pid"] != os.getpid()


def test_ps_and_psutil_see_the_ranks_own_command_and_environment(tmp_path: Path) -> None:
    """Not the server's: operators (and the fault suite) find ranks by their command line and environment."""
    import psutil

    log = tmp_path / "rank.log"
    code = "import time; print('asleep', flush=True); time.sleep(3600)"
    env = dict(os.environ, DSTUNE_PROBE="seen-by-ps")
    rank = node_client().start([sys.executable, "-c", code, "marker-arg"], env, log)
    wait_until(lambda: log.exists() and "asleep" in log.read_text())
    seen = psutil.Process(rank.pid)
    assert [arg for arg in seen.cmdline() if arg] == [sys.executable, "-c", code, "marker-arg"]
    assert seen.environ()["DSTUNE_PROBE"] == "seen-by-ps" and "DSTUNE_FORKSERVER_ROOM" not in seen.environ()
    os.killpg(rank.pid, signal.SIGKILL)
    assert rank.wait(timeout=60) == -signal.SIGKILL


def test_ranks_find_deepspeeds_built_cpu_ops_loaded(tmp_path: Path) -> None:
    """The server loaded the ops already built (the suite prebuilds them), so no rank takes torch's build lock (a
    rank killed inside it would leave every later rank waiting)."""
    code = "from deepspeed.ops.op_builder.builder import OpBuilder; print(sorted(OpBuilder._loaded_ops))"
    rank = node_client().start([sys.executable, "-c", code], dict(os.environ), tmp_path / "rank.log")
    assert rank.wait(timeout=120) == 0
    assert "deepspeed_shm_comm" in (tmp_path / "rank.log").read_text()


def test_a_module_entry_runs_as_main(tmp_path: Path) -> None:
    client = node_client()
    rank = client.start([sys.executable, "-m", "json.tool", "--help"], dict(os.environ), tmp_path / "rank.log")
    assert rank.wait(timeout=120) == 0
    assert "usage:" in (tmp_path / "rank.log").read_text()


def test_an_entry_of_another_interpreter_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ForkServerUnavailable, match=r"runs .* entries"):
        node_client().start(["/usr/bin/env", "python3", "-c", "pass"], dict(os.environ), tmp_path / "rank.log")
    assert node_client().request({"op": "ping"})["pid"] > 0  # and the server still serves


def test_a_launcher_that_dies_takes_its_ranks_with_it(tmp_path: Path) -> None:
    """The launcher is SIGKILLed while its rank sleeps: the server kills the rank (as PDEATHSIG would)."""
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, sys, time
                from pathlib import Path
                from tuner.measure.forkserver import node_client
                sleeper = [sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(3600)"]
                rank = node_client().start(sleeper, dict(os.environ), Path({str(tmp_path)!r}) / "r.log")
                print(rank.pid, flush=True)
                time.sleep(3600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    log = tmp_path / "r.log"
    wait_until(lambda: log.exists() and "asleep" in log.read_text())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    wait_until(lambda: not alive(pid))


def test_the_server_key_follows_what_the_preloaded_imports_depend_on() -> None:
    base = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}  # the suite sets it
    base["DS_ACCELERATOR"] = "cpu"
    assert server_key(base) == server_key(dict(base))
    assert server_key(dict(base, DS_ACCELERATOR="cuda")) != server_key(base)
    assert server_key(dict(base, PYTHONPATH="/elsewhere")) != server_key(base)
    assert server_key(dict(base, MALLOC_MMAP_THRESHOLD_="131072")) != server_key(base)  # read when malloc starts
    assert server_key(dict(base, OMP_NUM_THREADS="1")) != server_key(base)
    assert server_key(dict(base, RANK="1", MASTER_PORT="29500", DSTUNE_FAULT_MARKER="x")) == server_key(base)


def test_a_transformers_run_preloads_its_model_family() -> None:
    def spec(model: dict) -> RunSpec:
        return RunSpec({"model": model}, {})

    llama = {"implementation": "transformers", "hf_config": '{"model_type": "llama"}'}
    assert rank_preloads(spec(llama)) == ["transformers.models.llama.modeling_llama"]
    assert rank_preloads(spec({"family": "llama"})) == []  # the built-in model
    assert rank_preloads(spec({**llama, "hf_config": '{"model_type": "../x"}'})) == []


def sleeper_rank(tmp_path: Path, seconds: float, code: int = 0):  # type: ignore[no-untyped-def]
    """A rank of this process's node server that says it is up, sleeps ``seconds`` and exits with ``code``."""
    script = f"import sys, time; print('up', flush=True); time.sleep({seconds}); sys.exit({code})"
    log = tmp_path / "sleeper.log"
    rank = node_client().start([sys.executable, "-c", script], dict(os.environ), log)
    wait_until(lambda: log.exists() and "up" in log.read_text())
    return rank


def test_a_server_killed_mid_rank_takes_the_rank_and_the_launcher_sees_it_lost(tmp_path: Path) -> None:
    """SIGKILL on the server: the rank dies by its death signal, the launcher's poll says lost (not the rank's own
    exit), and the next rank start gets a new server."""
    client = node_client()
    server = client.request({"op": "ping"})["pid"]
    rank = sleeper_rank(tmp_path, 3600)
    os.kill(server, signal.SIGKILL)
    assert rank.wait(timeout=60) == -signal.SIGKILL
    assert rank.lost is not None and "fork server" in rank.lost
    assert node_client() is not client and node_client().request({"op": "ping"})["pid"] != server


def test_a_stopped_server_is_replaced_and_its_ranks_finish_on_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP on the server: its rank carries on and its exit code is read through /proc after the poll timeout;
    the stopped server's socket is retired, so the next rank start gets a new server instead of waiting on it."""
    from tuner.measure.forkserver import client as forkserver

    monkeypatch.setattr(forkserver, "ANSWER_TIMEOUT_S", 2.0)
    client = node_client()
    server = client.request({"op": "ping"})["pid"]
    rank = sleeper_rank(tmp_path, 4, code=7)
    os.kill(server, signal.SIGSTOP)
    try:
        assert rank.wait(timeout=120) == 7  # a zombie of the stopped server: its own exit status
        assert rank.lost is not None and "did not answer" in rank.lost
        fresh = node_client()
        assert fresh is not client and fresh.request({"op": "ping"})["pid"] != server
    finally:
        os.kill(server, signal.SIGKILL)  # the test stopped it: it goes (SIGKILL reaches a stopped process)
