"""No code through a job, no secret to a reader, every expensive answer delivered once, as rows of
``bench/faults.py``: each injection returns an ``Outcome`` whose criterion can fail. Real components: the API app
(FastAPI's client in this process: the app, its store and its worker threads as served), the CLI as a subprocess."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
DSTUNE = str(Path(sys.executable).with_name("dstune"))
TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOADER = {"LD_PRELOAD": "/tmp/x.so", "LD_LIBRARY_PATH": "/tmp", "PYTHONPATH": "/tmp", "PYTHONSTARTUP": "x",
          "PATH": "/tmp", "NCCL_NET_PLUGIN": "x", "NCCL_TUNER_PLUGIN": "x", "NCCL_PROFILER_PLUGIN": "x",
          "NCCL_DEBUG_FILE": "x", "OMP_TOOL_LIBRARIES": "x", "GLIBC_TUNABLES": "x",
          "MALLOC_CONF": "prof:true"}  # fmt: skip
SECRETS = {"HF_TOKEN": "x", "WANDB_API_KEY": "x", "AWS_SECRET_ACCESS_KEY": "x", "NCCL_SOCKET_IFNAME": "hf_" + "a1" * 17,
           "NCCL_IB_HCA": "ghp_" + "Ab3" * 12, "NCCL_ALGO": "0123456789abcdef0123456789abcdef"}  # fmt: skip
BOUNDS = {"OMP_NUM_THREADS": "99999999999", "MKL_NUM_THREADS": "0", "NCCL_BUFFSIZE": "9" * 30}
DIMENSIONS = [("bart", "decoder_layers", 10**6), ("bart", "decoder_ffn_dim", 10**9), ("mamba", "state_size", 10**9),
              ("mamba", "expand", 10**9), ("deepseek_v3", "v_head_dim", 10**9), ("t5", "d_ff", 10**9),
              ("whisper", "encoder_layers", 10**6), ("mamba2", "n_groups", 10**7)]  # fmt: skip
WORK = {"model": "tiny-gpt2", "model_impl": "builtin", "device": "cpu", "seq_len": 256}
LONG = {"model": "llama-2-7b", "model_impl": "builtin", "seq_len": "max"}


def _outcome(**kwargs: Any) -> Any:
    from faults import Outcome  # the runner's record (bench/faults.py)

    return Outcome(**kwargs)


def _client(**options: Any) -> Any:
    from fastapi.testclient import TestClient

    from tuner.api import create_app

    return TestClient(create_app(f"sqlite:///{Path(tempfile.mkdtemp()) / 'dstune.db'}", TOKEN, **options))


def launch_variables() -> Any:
    """Loader, interpreter, plug-in and file variables, credentials and unbounded values in a job: 422 naming each;
    an allowed job's variables shown to nobody without the token."""
    refused = 0
    cases = {**LOADER, **SECRETS, **BOUNDS}
    with _client() as client:
        for name, value in cases.items():
            body = {"workload": {**WORK, "launch": {"variables": {name: value}}}}
            answer = client.post("/v1/jobs", json=body, headers=AUTH)
            refused += answer.status_code == 422 and name in answer.text
        body = {"workload": {**WORK, "launch": {"variables": {"NCCL_SOCKET_IFNAME": "private_name"}}}}
        job = client.post("/v1/jobs", json=body, headers=AUTH).json()["id"]
        shown = sum("private_name" in client.get(path).text for path in ("/v1/jobs", f"/v1/jobs/{job}"))
    return _outcome(
        recovered=refused == len(cases) and shown == 0,
        note=f"{refused}/{len(cases)} refused 422 naming the variable; shown without token: {shown}",
    )


def long_answer_once() -> Any:
    """A seq_len max estimate past a 0.5 s budget, retried every 0.2 s: 503s while it computes (once), then the
    answer from memory; another long request from the same client meanwhile: 503 before any work."""
    from tuner.api.routes import estimate as route

    real, calls = route.longest, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    route.longest = counted
    started = time.monotonic()
    answers: list[int] = []
    busy = 0
    try:
        with _client(request_budget_s=0.5) as client:
            body = {"workload": {**LONG, "gpus": 8}}
            while (code := client.post("/v1/estimate", json=body).status_code) != 200 and len(answers) < 3000:
                answers.append(code)
                other = {"workload": {**LONG, "gpus": 2 + len(answers) % 5}}
                busy += "nothing was started" in client.post("/v1/estimate", json=other).text
                time.sleep(0.2)
            took = time.monotonic() - started
    finally:
        route.longest = real
    ok = code == 200 and set(answers) <= {503}
    return _outcome(
        recovered=ok and len(calls) <= 2,  # the answer's, and at most one other that found a slot after it
        recover_s=took,
        note=f"{len(answers)} retries 503, then 200; computed {len(calls)} time(s); {busy} others refused unstarted",
    )


def long_answer_flood() -> Any:
    """24 distinct seq_len max requests at once from one client: one computation starts, the rest 503 at once."""
    from tuner.api.routes import recommend as route

    real, running, peak = route.recommend_longest, [0], [0]
    lock = threading.Lock()

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    route.recommend_longest = counted
    try:
        with _client(request_budget_s=2.0) as client:
            bodies = [
                {"workload": {**LONG, "gpus": gpus, "nodes": nodes}} for gpus in (1, 2, 4, 8) for nodes in range(1, 7)
            ]
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda body: client.post("/v1/recommend", json=body), bodies))
            fastest_refusal = time.monotonic() - started
            codes = [answer.status_code for answer in answers]
            unstarted = sum("nothing was started" in answer.text for answer in answers)
    finally:
        route.recommend_longest = real
    return _outcome(
        recovered=peak[0] <= 2 and 500 not in codes,
        recover_s=fastest_refusal,
        note=f"{len(bodies)} requests: {unstarted} refused unstarted, at most {peak[0]} computing at once",
    )


def dimensions() -> Any:
    """Encoder-decoder, state-space and MLA dimensions far out of bounds: 422 naming the key, at once."""
    slowest, good = 0.0, 0
    with _client() as client:
        for family, key, value in DIMENSIONS:
            started = time.monotonic()
            answer = client.post("/v1/estimate", json={"workload": {"config": {"model_type": family, key: value}}})
            slowest = max(slowest, time.monotonic() - started)
            good += answer.status_code == 422 and key in answer.text
    return _outcome(recovered=good == len(DIMENSIONS), recover_s=slowest, note=f"{good}/{len(DIMENSIONS)} 422")


def _cli(args: list[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([DSTUNE, *args], capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def host_memory() -> Any:
    """``dstune measure`` of tiny-llama on 2 CPU ranks at 1M tokens, --gpu-memory left out (each rank's share of this
    host): refused before any rank starts."""
    _, text, seconds = _cli(["measure", "--model", "tiny-llama", "--model-impl", "builtin", "--gpus", "2",
                             "--device", "cpu", "--seq-len", "1048576", "--json"])  # fmt: skip
    data = json.loads(text[text.index("{") :]) if "{" in text else {}
    ok = data.get("status") == "oom" and data.get("exception_type") == "HostMemory"
    return _outcome(recovered=ok, recover_s=seconds, note=(data.get("error") or text[-200:])[:110])


def sigterm_worker() -> Any:
    """``dstune worker`` polling, sent SIGTERM: one line, exit 143, within 10 s."""
    folder = Path(tempfile.mkdtemp())
    db = folder / "dstune.db"
    process = subprocess.Popen([DSTUNE, "worker", "--storage", f"sqlite:///{db}", "--poll", "0.2"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(db) as connection:
                if connection.execute("select count(*) from sqlite_master where name='dstune_jobs'").fetchone()[0]:
                    break
        except sqlite3.Error:
            pass
        time.sleep(0.1)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    took = time.monotonic() - started
    ok = process.returncode == 143 and "terminated (SIGTERM)" in stderr and "Traceback" not in stderr
    return _outcome(recovered=ok and took < 10, recover_s=took, note=f"exit {process.returncode}")


def smaller_items() -> Any:
    """best --out naming the study's database, a --storage of no dialect, a 390 KB space aliasing one long string
    10,000 times: exit 2 with one line each, the database whole."""
    from hostile import measured_study  # bench/hostile.py

    db = Path(measured_study().removeprefix("sqlite:///"))
    folder = db.parent
    before = db.read_bytes()
    long = "x" * 350_000
    (folder / "space.yaml").write_text(f"a: &a {long}\nb: [{', '.join(['*a'] * 10_000)}]\n")
    cases = [
        ["best", "--study", "s", "--storage", f"sqlite:///{db}", "--out", str(db)],
        ["best", "--study", "s", "--storage", "mongodb://db/x"],
        ["tune", "--model", "tiny-gpt2", "--device", "cpu", "--space", str(folder / "space.yaml"),
         "--storage", f"sqlite:///{folder / 'other.db'}"],
    ]  # fmt: skip
    results = [_cli(args) for args in cases]
    good = sum(code == 2 and "Traceback" not in text for code, text, _ in results)
    whole = db.read_bytes() == before
    slowest = max(seconds for _, _, seconds in results)
    return _outcome(
        recovered=good == len(cases) and whole, recover_s=slowest, note=f"{good}/3 exit 2, database whole: {whole}"
    )


def _lowest_available(stop: threading.Event, lowest: list[int]) -> None:
    """Sample the kernel's MemAvailable every 50 ms into ``lowest[0]`` until ``stop``."""
    import psutil

    while not stop.is_set():
        lowest[0] = min(lowest[0], psutil.virtual_memory().available)
        time.sleep(0.05)


def host_cap() -> Any:
    """Two real CPU ranks of tiny-gpt2 under the launcher's default cap (each rank's share of the memory available
    when it started), one growing in its step to 1.25 times that share, 64 MiB at a time, as an estimate that is
    wrong would: the run ``oom`` / HostMemory, no rank left, and the host's MemAvailable (the kernel's, sampled every
    50 ms) never below the fifth of it the cap leaves."""
    import psutil
    from faults import new_marker, orphans_after
    from test_process_faults import ENTRY, run_spec

    from tuner.measure.driver.host_memory import rank_share
    from tuner.measure.driver.local_launcher import launch_local

    marker = new_marker()
    before = psutil.virtual_memory().available
    growth = int(rank_share(2) * 1.25)
    lowest, stop = [before], threading.Event()
    sampler = threading.Thread(target=_lowest_available, args=(stop, lowest), daemon=True)
    sampler.start()
    entry = [sys.executable, str(ENTRY), f"grow:{growth}", "1"]
    try:
        result = launch_local(run_spec(2), timeout=300.0, entry=entry)
    finally:
        stop.set()
        sampler.join()
    returned = time.monotonic()
    orphans, _ = orphans_after(marker, returned)
    failed_at = result.ranks[1].failed_at if len(result.ranks) > 1 else None
    recover = time.time() - failed_at if failed_at else result.timings.get("wall_s")
    ok = result.status == "oom" and result.exception_type == "HostMemory" and orphans == 0
    floor = lowest[0] >= before // 5
    killed = (result.error or "").split(" (")[0]
    note = (
        f"{killed}; MemAvailable {before / 2**30:.1f} GiB before, lowest {lowest[0] / 2**30:.1f} GiB; growth asked "
        f"{growth / 2**30:.1f} GiB"
    )
    return _outcome(recovered=ok and floor, orphans=orphans, recover_s=recover, note=note)


def best_out_not_json() -> Any:
    """best --out naming an existing training script and an existing text file: exit 2 naming out, both whole; an
    earlier export (JSON) written over."""
    from hostile import measured_study  # bench/hostile.py

    storage = measured_study()
    folder = Path(tempfile.mkdtemp())
    files = {"train.py": "print('train')\n", "notes.txt": "my notes\n", "old.json": '{"old": 1}\n'}
    for name, text in files.items():
        (folder / name).write_text(text)
    results = {
        name: _cli(["best", "--study", "s", "--storage", storage, "--out", str(folder / name)]) for name in files
    }
    refused = sum(results[name][0] == 2 and "error: out: " in results[name][1] for name in ("train.py", "notes.txt"))
    whole = all((folder / name).read_text() == files[name] for name in ("train.py", "notes.txt"))
    exported = results["old.json"][0] == 0 and "train_micro_batch_size_per_gpu" in (folder / "old.json").read_text()
    slowest = max(seconds for _, _, seconds in results.values())
    note = f"{refused}/2 exit 2, both whole: {whole}; earlier export written over: {exported}"
    return _outcome(recovered=refused == 2 and whole and exported, recover_s=slowest, note=note)


def rows() -> list[tuple[str, str, bool, Any]]:
    """(name, criterion, needs DeepSpeed, injection) for bench/faults.py's matrix."""
    return [
        ("launch variables: code, secrets (API)", "422 naming it, none shown without token", False, launch_variables),
        ("seq_len max past the budget (API)", "computed once, retry answered", False, long_answer_once),
        ("seq_len max flood, one client (API)", "<= 2 computing, rest 503 unstarted", False, long_answer_flood),
        ("config dimensions by name (API)", "422 naming the key, < 1 s", False, dimensions),
        ("measure past the host (CLI, CPU ranks)", "oom HostMemory before any rank", False, host_memory),
        ("SIGTERM to dstune worker", "one line, exit 143, < 10 s", False, sigterm_worker),
        ("best --out db, bad dialect, YAML bytes", "exit 2, database whole", False, smaller_items),
        ("rank past its host-memory share (CPU ranks)", "oom HostMemory, no rank left, host kept", True, host_cap),
        ("best --out over a script or a note", "exit 2, files whole", False, best_out_not_json),
    ]


__all__ = ["rows"]
