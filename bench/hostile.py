"""Hostile input and broken environments, as rows of ``bench/faults.py``: each injection returns an
:class:`Outcome` whose criterion can fail. Real processes throughout: ``dstune serve`` over HTTP, the CLI as a
subprocess; the full disk is SQLite's own "database or disk is full" (``max_page_count`` capping the file)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the tests' helpers (and their own imports: postgres)
DSTUNE = str(Path(sys.executable).with_name("dstune"))
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 512, "n_positions": 128}
PATTERNS = ["(.|.)*z", "(a+)+$", "((a*)*)*b", "(a|aa)*c", "(\\w+\\s?)+$", "(.*a){30}x"]
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]


def _outcome(**kwargs: Any) -> Any:
    from faults import Outcome  # the runner's record (bench/faults.py)

    return Outcome(**kwargs)


def _server() -> tuple[subprocess.Popen[str], str, Path]:
    from tests.api.test_serve_process import start_server

    folder = Path(tempfile.mkdtemp(prefix="dstune-hostile-"))
    process, base = start_server(folder)
    return process, base, folder


def serve_stop(stop: signal.Signals) -> Any:
    """A real server with its profiling worker busy, stopped with ``stop``: nothing it started may outlive it."""
    import httpx
    import psutil

    process, base, _ = _server()
    body = {"workload": {"config": {**TINY, "n_layer": 3}, "seq_len": 64, "device": "cpu"}}
    httpx.post(f"{base}/v1/estimate", json=body, timeout=60)
    children = psutil.Process(process.pid).children(recursive=True)
    stopped = time.monotonic()
    process.send_signal(stop)
    process.wait(60)
    _, alive = psutil.wait_procs(children, timeout=10)
    for left in alive:
        left.kill()
    gone_s = time.monotonic() - stopped
    return _outcome(
        recovered=bool(children) and not alive, orphans=len(alive), recover_s=gone_s, note=f"{len(children)} child(ren)"
    )


def hostile_patterns() -> Any:
    """Backtracking patterns as freeze and as peft target_modules: each answered within 30 s, /healthz under 1 s."""
    import httpx

    process, base, _ = _server()
    worst, slow_health, bad = 0.0, 0, []
    try:
        for pattern in PATTERNS:
            for workload in (
                {"model": "tiny-gpt2", "freeze": pattern},
                {"config": TINY, "seq_len": 64, "device": "cpu", "peft": {"r": 4, "target_modules": pattern}},
            ):
                started = time.monotonic()
                answer = httpx.post(f"{base}/v1/estimate", json={"workload": workload}, timeout=60)
                worst = max(worst, time.monotonic() - started)
                if answer.status_code not in (200, 422, 503):
                    bad.append(answer.status_code)
                started = time.monotonic()
                httpx.get(f"{base}/healthz", timeout=5)
                slow_health += time.monotonic() - started > 1.0
    finally:
        process.terminate()
        process.wait(60)
    ok = worst < 30 and not slow_health and not bad
    return _outcome(recovered=ok, recover_s=worst, note=f"{2 * len(PATTERNS)} requests, slowest {worst:.1f} s")


def non_finite() -> Any:
    """NaN/Infinity/1e400 in typed fields and free-form objects: 422 naming the field, never 500 or 200."""
    from fastapi.testclient import TestClient

    from tests.api.test_hostile_input import AUTH, TOKEN, _placements
    from tuner.api import create_app

    cases = [case for bad in NON_FINITE for case in _placements(bad)]
    db = Path(tempfile.mkdtemp()) / "dstune.db"
    wrong = []
    with TestClient(create_app(f"sqlite:///{db}", token=TOKEN)) as client:
        for path, body, field in cases:
            answer = client.post(path, content=body, headers={**AUTH, "content-type": "application/json"})
            if answer.status_code != 422 or field not in answer.text:
                wrong.append(answer.status_code)
    return _outcome(recovered=not wrong, note=f"{len(cases)} placements, {len(wrong)} not 422")


def _cli(args: list[str], **env: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([DSTUNE, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    return done.returncode, done.stderr, time.monotonic() - started


def _one_line(code: int, stderr: str, expected: int) -> bool:
    return code == expected and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def bad_environment() -> Any:
    """Storage and paths that cannot be used, from every command: one line, at once; exit 2 for a URL of no dialect
    (the flag's input), exit 1 for the rest (the environment)."""
    folder = Path(tempfile.mkdtemp())
    cases = [
        ["best", "--study", "x", "--storage", "mongodb://db/x"],
        ["worker", "--storage", "sqlite:////no/such/folder/x.db"],
        ["best", "--study", "x", "--storage", "sqlite:////proc/x.db"],
        ["best", "--study", "x", "--storage", "postgresql+psycopg://u:p@no-such-host.invalid/x"],
        ["serve", "--storage", "not a url"],
    ]
    results = [_cli(args, DSTUNE_DB_RETRY_S="30", DSTUNE_API_TOKEN="x", HOME=str(folder)) for args in cases]
    expected = [2, 1, 1, 1, 2]
    good = sum(_one_line(code, err, want) and s < 25 for (code, err, s), want in zip(results, expected, strict=True))
    slowest = max(seconds for _, _, seconds in results)
    return _outcome(recovered=good == len(cases), recover_s=slowest, note=f"{good}/{len(cases)} one line, exit 2 / 1")


def unreachable_database() -> Any:
    """A refused PostgreSQL past DSTUNE_DB_RETRY_S: the last line is the one error line, exit 1, no traceback."""
    code, stderr, seconds = _cli(
        ["best", "--study", "x", "--storage", "postgresql+psycopg://u:p@127.0.0.1:1/x"], DSTUNE_DB_RETRY_S="2"
    )
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    ok = code == 1 and last.startswith("error: database unavailable") and "Traceback" not in stderr
    return _outcome(recovered=ok, recover_s=seconds, note=f"{len(stderr.splitlines())} stderr lines")


def disk_full() -> Any:
    """SQLite's file capped: POST /v1/jobs answers 503 + Retry-After (not 500), /healthz says degraded."""
    from fastapi.testclient import TestClient

    from tests.api.test_environment import AUTH, JOB, TOKEN, _fill_the_disk
    from tuner.api import create_app

    app = create_app(f"sqlite:///{Path(tempfile.mkdtemp()) / 'dstune.db'}", token=TOKEN)
    with TestClient(app, raise_server_exceptions=False) as client:
        _fill_the_disk(app)
        codes = [client.post("/v1/jobs", json=JOB, headers=AUTH).status_code for _ in range(40)]
        health = client.get("/healthz").json().get("status")
    ok = 500 not in codes and 503 in codes and health == "degraded"
    return _outcome(recovered=ok, note=f"answers {sorted(set(codes))}, healthz {health}")


def measured_study() -> str:
    """The URL of a new SQLite database holding study ``s`` with one measured trial."""
    from tuner.estimator import estimate
    from tuner.requests import WorkloadRequest, to_workload
    from tuner.storage import Store

    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'dstune.db'}"
    workload = to_workload(WorkloadRequest(model="gpt2", gpus=2, gpu_memory="24GiB", seq_len=512))
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    config |= {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}
    with Store.open(url) as store:
        study = store.get_or_create_study("s", store.upsert_workload(workload), "tpe", {})
        trial = store.add_trial(study.id, 0, "k0", config, {}, False, estimate(workload, config))
        store.start_trial(trial)
        store.finish_trial(trial, "ok", {"tokens_per_s": 100.0, "peak_bytes_per_rank": [2**30, 2**30]})
    return url


def out_unwritable() -> Any:
    """``best --out`` to /dev/full and to a read-only path: one line naming the path, exit 1."""
    url = measured_study()
    results = [_cli(["best", "--study", "s", "--storage", url, "--out", out]) for out in ("/dev/full", "/proc/x")]
    good = sum(_one_line(code, err, 1) for code, err, _ in results)
    return _outcome(recovered=good == 2, note=f"{good}/2 one line, exit 1")


def yaml_bomb_and_names() -> Any:
    """An alias bomb in --space and hostile --study names: exit 2 at once, no study row."""
    from tests.space.test_yaml_bounded import bomb

    folder = Path(tempfile.mkdtemp())
    (folder / "bomb.yaml").write_text(bomb())
    storage = f"sqlite:///{folder / 'dstune.db'}"
    tune = ["tune", "--model", "tiny-gpt2", "--device", "cpu", "--trials", "1", "--storage", storage]
    cases = [[*tune, "--space", str(folder / "bomb.yaml")]]
    cases += [[*tune, "--study", name] for name in ("", "a\x01b", "\U0001f600", "x" * 300)]
    results = [_cli(args) for args in cases]
    good = sum(_one_line(code, err, 2) and seconds < 60 for code, err, seconds in results)
    rows = 0
    if (folder / "dstune.db").exists():
        import sqlite3

        with sqlite3.connect(folder / "dstune.db") as connection:
            rows = connection.execute("select count(*) from dstune_studies").fetchone()[0]
    slowest = max(seconds for _, _, seconds in results)
    return _outcome(
        recovered=good == len(cases) and rows == 0,
        recover_s=slowest,
        note=f"{good}/{len(cases)} exit 2, {rows} study rows",
    )


def rows() -> list[tuple[str, str, bool, Any]]:
    """(name, criterion, needs DeepSpeed, injection) for bench/faults.py's matrix."""
    return [
        ("serve SIGTERM: profiling worker", "no child left 10 s after", False, lambda: serve_stop(signal.SIGTERM)),
        ("serve SIGKILL: profiling worker", "no child left 10 s after", False, lambda: serve_stop(signal.SIGKILL)),
        ("backtracking patterns (API)", "answered < 30 s, /healthz < 1 s", False, hostile_patterns),
        ("NaN/Infinity/1e400 (API)", "422 naming the field", False, non_finite),
        ("bad storage URL / path (CLI)", "one line, exit 2 (URL) / 1, < 25 s", False, bad_environment),
        ("PostgreSQL unreachable (CLI)", "one error line, exit 1", False, unreachable_database),
        ("disk full (API, SQLite)", "503 + degraded, no 500", False, disk_full),
        ("best --out unwritable", "one line, exit 1", False, out_unwritable),
        ("YAML alias bomb, bad --study", "exit 2 at once, no row", False, yaml_bomb_and_names),
    ]


__all__ = ["rows"]
