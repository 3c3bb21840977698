"""The hostile variations of ``bench/security.py``'s rows, as rows of ``bench/faults.py``: other variable names and
credential shapes, other stop signals, JSON nested past every limit, jobs that carry a training command, a script
study's command before an open reader, a SIGKILLed driver's private Ray, records stored before a variable was
refused. Real components: the API app (FastAPI's client in this process), the CLI and the worker as subprocesses, a
real local Ray."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from security import AUTH, DSTUNE, WORK, _cli, _client, _outcome

NAMES = ["ld_preload", "\u039fMP_NUM_THREADS", "BASH_ENV", "ENV", "LD_AUDIT", "GCONV_PATH", "PYTHONSTARTUP",
         "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "TRITON_HOME", "NCCL_TUNER_PLUGIN", "NCCL_GIN_PLUGIN",
         "NCCL_COMM_ID", "NCCL_RAS_ADDR", "NCCL_TOPO_DUMP_FILE", "MKL_VERBOSE_OUTPUT_FILE"]  # fmt: skip
CREDENTIALS = ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "wJalrXUtnFEMI+K7MDENG+bPxRfiCYEXAMPLEKEY",
               "AKIAIOSFODNN7EXAMPLE", "sk_live_abcdefghijklmnopqrstuvwx", "ya29.a0AfH6SMBx-abcdefGHIJKLmnop",
               "AIzaSyA-1234567890abcdefghijklmnopqrstu", "npm_abcdefghijklmnopqrstuvwxyzABCDEF0123",
               "pypi-AgEIcHlwaS5vcmcCJGFiY2Rl", "user:password@host", "glpat-xxxxxxxxxxxxxxxxxxxx",
               "abcdefghijklmnopqrstuvwxyzABCDEF"]  # fmt: skip
STOP_SIGNALS = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SCRIPT = "import pathlib, sys\npathlib.Path(__file__).with_name('ran.txt').write_text('ran')\nsys.exit('boom')\n"


def names_and_credentials() -> Any:
    """Other variable names (lower case, a Greek O, shell, loader, compiler and Triton paths, NCCL plug-ins and
    addresses) and credentials in values (JWT, AWS, Stripe, Google, npm, PyPI, a URL's password): 422 naming each."""
    cases = [(name, "1") for name in NAMES] + [("NCCL_ALGO", value) for value in CREDENTIALS]
    refused = 0
    with _client() as client:
        for name, value in cases:
            body = {"workload": {**WORK, "launch": {"variables": {name: value}}}}
            answer = client.post("/v1/jobs", json=body, headers=AUTH)
            refused += answer.status_code == 422 and name in json.dumps(answer.json(), ensure_ascii=False)
    return _outcome(recovered=refused == len(cases), note=f"{refused}/{len(cases)} refused 422 naming the variable")


def stop_signals() -> Any:
    """SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to a polling ``dstune worker``: one line, exit 128 + the signal."""
    good, slowest = 0, 0.0
    for stop in STOP_SIGNALS:
        db = Path(tempfile.mkdtemp()) / "dstune.db"
        process = subprocess.Popen([DSTUNE, "worker", "--storage", f"sqlite:///{db}", "--poll", "0.2"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=_default_signals)  # fmt: skip
        while not _has_queue(db) and process.poll() is None:
            time.sleep(0.1)
        started = time.monotonic()
        process.send_signal(stop)
        _, stderr = process.communicate(timeout=120)
        slowest = max(slowest, time.monotonic() - started)
        good += process.returncode == 128 + stop and f"terminated ({stop.name})" in stderr and "Traceback" not in stderr
    return _outcome(recovered=good == len(STOP_SIGNALS), recover_s=slowest, note=f"{good}/4 one line, 128 + signal")


def _default_signals() -> None:
    """The stop signals as a terminal's foreground job has them: a signal ignored at start stays ignored (``nohup``;
    a non-interactive shell's ``&`` ignores SIGINT and SIGQUIT), and this bench may run under either."""
    for stop in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(stop, signal.SIG_DFL)


def _has_queue(db: Path) -> bool:
    try:
        with sqlite3.connect(db) as connection:
            return bool(connection.execute("select count(*) from sqlite_master where name='dstune_jobs'").fetchone()[0])
    except sqlite3.Error:
        return False


def deep_json() -> Any:
    """Objects nested 500, 900, 5,000 and 50,000 deep in a ds_config, pins or a config.json (API), and in a
    config.json or a job file (CLI): 422 or exit 2, never a 500 or a traceback."""
    answers, good = 0, 0
    with _client() as client:
        for depth in (500, 900, 5000, 50_000):
            nested = '{"a":' * depth + "1" + "}" * depth
            config = f'{{"model_type": "gpt2", "x": {nested}}}'
            for path, body in (("/v1/estimate", f'{{"workload": {json.dumps(WORK)}, "ds_config": {nested}}}'),
                               ("/v1/jobs", f'{{"workload": {json.dumps(WORK)}, "pins": {nested}}}'),
                               ("/v1/recommend", f'{{"workload": {{"config": {config}}}}}')):  # fmt: skip
                answer = client.post(path, content=body, headers={"content-type": "application/json", **AUTH})
                answers, good = answers + 1, good + (answer.status_code == 422)
    folder = Path(tempfile.mkdtemp())
    (folder / "deep.json").write_text('{"a":' * 5000 + "1" + "}" * 5000)
    for args in (["estimate", "--model", str(folder / "deep.json")],
                 ["queue", str(folder / "deep.json"), "--storage", f"sqlite:///{folder / 'q.db'}"]):  # fmt: skip
        code, text, _ = _cli(args)
        answers, good = answers + 1, good + (code == 2 and "Traceback" not in text)
    return _outcome(recovered=good == answers, note=f"{good}/{answers} 422 or exit 2")


def script_jobs() -> Any:
    """A job carrying a command: POST /v1/jobs 403 with the token; queued by dstune queue, a worker without
    --allow-scripts and one trusting another folder fail it unrun (the script never leaves its mark)."""
    folder = Path(tempfile.mkdtemp())
    project, other = folder / "proj", folder / "other"
    project.mkdir()
    other.mkdir()
    (project / "train.py").write_text(SCRIPT)
    (project / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 1}')
    (folder / "job.json").write_text(json.dumps({"workload": {"model": "tiny-llama", "gpus": 2, "device": "cpu"}}))
    with _client() as client:
        script = {"argv": ["python", "-c", "import os"], "cwd": "/tmp"}
        refused = client.post("/v1/jobs", json={"workload": WORK, "script": script}, headers=AUTH).status_code == 403
    db = f"sqlite:///{folder / 'jobs.db'}"
    failed = 0
    for trust in ([], ["--allow-scripts", str(other)]):
        queued = [DSTUNE, "queue", str(folder / "job.json"), "--storage", db, "--", "python", "train.py"]
        subprocess.run([*queued, "--deepspeed", "ds.json"], cwd=project, capture_output=True, timeout=300, check=False)
        subprocess.run(
            [DSTUNE, "worker", "--once", "--storage", db, *trust], capture_output=True, timeout=300, check=False
        )
        failed += _last_job_failed_untrusted(folder / "jobs.db")
    ran = (project / "ran.txt").exists()
    return _outcome(recovered=refused and failed == 2 and not ran, note=f"API 403: {refused}; {failed}/2 failed unrun")


def _last_job_failed_untrusted(db: Path) -> bool:
    with sqlite3.connect(db) as connection:
        status, error = connection.execute("select status, error from dstune_jobs order by id desc").fetchone()
    return status == "failed" and "UntrustedCommand" in (error or "")


def script_command_shown() -> Any:
    """A script study holding a token in its command: the open API, the dashboard's pages and /v1/recommend's notes
    show neither the token nor the command's folder."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "api"))
    from test_readers import _seed_script_study  # tests/api/test_readers.py: a study as tune -- <command> stores it

    with _client() as client:
        _seed_script_study(client.app.state.store)
        pages = ["/v1/studies", "/v1/studies/s2", "/v1/studies/s2/trials", "/studies/s2", "/studies/s2/trials/0"]
        texts = [client.get(path).text for path in pages]
        texts.append(client.post("/v1/recommend", json={"workload": {"params": 1e8, "gpus": 2, "device": "cpu"}}).text)
    shown = sum("hf_secret" in text or "/home/alice" in text for text in texts)
    return _outcome(recovered=shown == 0, note=f"{len(texts)} open answers, {shown} showing the command")


def ray_agents() -> Any:
    """A driver that started a private local Ray, SIGKILLed: seconds until every process under its raylet is gone
    (the dashboard and runtime-env agents took about 70 s)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "measure"))
    from test_ray_reaper import DRIVER, _alive  # tests/measure/test_ray_reaper.py

    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert driver.stdout is not None
    noted = json.loads(driver.stdout.readline())
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    killed = time.monotonic()
    while _alive(noted) and time.monotonic() - killed < 120:
        time.sleep(0.2)
    took, left = time.monotonic() - killed, len(_alive(noted))
    return _outcome(recovered=left == 0 and took < 30, recover_s=took, orphans=left, note=f"{len(noted)} noted")


def stored_refused() -> Any:
    """A study and a queued job stored with LD_PRELOAD (before it was refused): the study reads (200), best exits 2
    naming it, the job fails with the reason and starts no study."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "worker"))
    from fastapi.testclient import TestClient
    from test_refused_stored import REFUSED, _stored_with_a_refused_variable

    from tuner.api import create_app
    from tuner.worker import work

    db = Path(tempfile.mkdtemp()) / "old.db"
    store = _stored_with_a_refused_variable(db)
    with TestClient(create_app(f"sqlite:///{db}", "token")) as client:
        detail = client.get("/v1/studies/old").status_code
    code, text, _ = _cli(["best", "--study", "old", "--storage", f"sqlite:///{db}"])
    job = store.enqueue_job("old-job", {"workload": {**WORK, "launch": {"variables": REFUSED}}, "launcher": "local"})
    work(store, once=True)
    ended = store.get_job(job.id)
    unrun = ended is not None and ended.status == "failed" and store.get_study("old-job") is None
    ok = detail == 200 and code == 2 and "refused now" in text and unrun
    return _outcome(recovered=ok, note=f"study {detail}, best exit {code}, job failed unrun: {unrun}")


def rows() -> list[tuple[str, str, bool, Any]]:
    """(name, criterion, needs DeepSpeed, injection) for bench/faults.py's matrix."""
    return [
        ("other names, credential shapes (API)", "422 naming it", False, names_and_credentials),
        ("SIGHUP/QUIT/USR1/USR2 to dstune worker", "one line, exit 128 + signal", False, stop_signals),
        ("JSON nested 500-50,000 deep (API, CLI)", "422 / exit 2, no 500", False, deep_json),
        ("job with a training command (API, worker)", "403; untrusted: failed unrun", False, script_jobs),
        ("script study's command (open readers)", "shown nowhere open", False, script_command_shown),
        ("driver SIGKILL, private Ray agents", "all gone < 30 s", False, ray_agents),
        ("stored refused launch variable", "reads; never runs", False, stored_refused),
    ]


__all__ = ["rows"]
