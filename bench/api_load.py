"""Load test of ``POST /v1/recommend``: 100 concurrent clients on loopback against a database of 10,000 trials.

Seeds a fresh SQLite database (or the PostgreSQL database given by ``--url``) with ``--trials`` trials over 16
workloads of GPT-2 (one study each: ok, pruned and out-of-memory trials, real estimates in their rows), starts
``dstune serve`` on 127.0.0.1 in a subprocess, and runs ``--clients`` closed-loop clients (httpx, one asyncio loop)
for ``--duration`` seconds. The clients cycle through three requests, one per answer source: a workload with
measurements (``measured``), the same model on an unmeasured cluster (``nearest``) and a model with no measurements
at all (``estimate``). Prints p50 and p99 latency and requests per second, overall and per source. Target: p99 under
25 ms.

Run: ``.venv/bin/python bench/api_load.py [--duration 30] [--clients 100] [--workers 1] [--url postgresql+psycopg://...]``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tuner.estimator import estimate
from tuner.jobs import WorkloadRequest, to_workload
from tuner.recommend import normalised
from tuner.store import Store, StudyRow, TrialRow, utcnow

GPT2 = {"model": "gpt2", "seq_len": 512}
REQUESTS = {
    "measured": {"workload": {**GPT2, "gpus": 2, "gpu_memory": "24GiB"}},
    "nearest": {"workload": {**GPT2, "gpus": 16, "gpu_memory": "24GiB"}},
    "estimate": {"workload": {"model": "llama-2-7b", "gpus": 8, "seq_len": 4096}},
}
DSTUNE = str(Path(sys.executable).with_name("dstune"))


def seed(url: str, n_trials: int) -> None:
    """``n_trials`` trials spread over 16 GPT-2 workloads (GPUs × memory × sequence length), one study each."""
    store = Store.open(url)
    shapes = list(itertools.product((1, 2, 4, 8), ("24GiB", "80GiB"), (512, 1024)))
    per_study = n_trials // len(shapes)
    configs = list(itertools.product((0, 1, 2, 3), (1, 2, 4, 8, 16), (1, 2, 4, 8)))
    now = utcnow()
    for index, (gpus, memory, seq_len) in enumerate(shapes):
        workload = normalised(to_workload(WorkloadRequest(model="gpt2", gpus=gpus, gpu_memory=memory, seq_len=seq_len)))
        study = store.get_or_create_study(f"bench-{index}", store.upsert_workload(workload), "tpe", {})
        rows = []
        for number in range(per_study):
            stage, micro, accum = configs[number % len(configs)]
            config = {
                "train_micro_batch_size_per_gpu": micro,
                "gradient_accumulation_steps": accum,
                "train_batch_size": micro * accum * gpus,
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": stage, "overlap_comm": number % 2 == 0},
            }
            est = estimate(workload, config).to_dict()
            status = ("ok", "ok", "ok", "pruned", "oom")[number % 5]
            ok = status == "ok"
            rows.append(
                TrialRow(
                    study_id=study.id,
                    number=number,
                    config_key=f"k{number}",
                    ds_config=config,
                    activation_checkpointing=False,
                    params={"stage": stage, "micro_batch": micro},
                    estimate=est,
                    estimated_peak_bytes=est["per_gpu"]["total"],
                    status=status,
                    prune_reason=None if status != "pruned" else "gpu: estimated peak too large",
                    measurement={"status": status, "tokens_per_s": 1000.0 + number} if ok else None,
                    tokens_per_s=1000.0 + (number * 7919) % 5000 if ok else None,
                    peak_bytes=est["per_gpu"]["total"] if ok else None,
                    attempts=1,
                    hardware=f"cuda:{workload.cluster.gpu_memory}",
                    created_at=now,
                    finished_at=now,
                )
            )
        with store.session() as session:
            session.add_all(rows)
            session.get(StudyRow, study.id).status = "finished"
    store.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(url: str, port: int, workers: int, cache_s: float) -> subprocess.Popen:
    env = {**os.environ, "DSTUNE_API_TOKEN": "bench-token"}
    command = [DSTUNE, "serve", "--storage", url, "--port", str(port), "--log-level", "warning"]
    command += ["--recommend-cache", str(cache_s)]
    if workers > 1:
        command += ["--workers", str(workers)]
    server = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not come up")


async def load(port: int, clients: int, duration: float) -> tuple[dict[str, list[float]], int, float]:
    """Closed-loop clients for ``duration`` seconds: latencies (seconds) by source, errors, elapsed."""
    latencies: dict[str, list[float]] = {name: [] for name in REQUESTS}
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30) as client:
        for name, body in REQUESTS.items():  # warm-up, and check each answers with its source
            answer = (await client.post("/v1/recommend", json=body)).json()
            assert answer["source"] == name, (name, answer)
        end = time.monotonic() + duration
        started = time.monotonic()

        async def one(offset: int) -> None:
            nonlocal errors
            for name in itertools.islice(itertools.cycle(REQUESTS), offset, None):
                if time.monotonic() >= end:
                    return
                t0 = time.perf_counter()
                response = await client.post("/v1/recommend", json=REQUESTS[name])
                elapsed = time.perf_counter() - t0
                if response.status_code != 200:
                    errors += 1
                latencies[name].append(elapsed)

        await asyncio.gather(*(one(i % len(REQUESTS)) for i in range(clients)))
    return latencies, errors, time.monotonic() - started


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients (default 100)")
    parser.add_argument("--trials", type=int, default=10_000, help="trials in the database (default 10,000)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    parser.add_argument("--cache", type=float, default=2.0, help="server's --recommend-cache seconds (0: off)")
    parser.add_argument("--url", help="an empty PostgreSQL database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    url = args.url or f"sqlite:///{Path(tempfile.mkdtemp(prefix='dstune-bench-')) / 'dstune.db'}"
    t0 = time.perf_counter()
    seed(url, args.trials)
    print(f"seeded {args.trials} trials in {time.perf_counter() - t0:.1f} s ({url.split(':')[0]})")
    port = free_port()
    server = start_server(url, port, args.workers, args.cache)
    try:
        latencies, errors, elapsed = asyncio.run(load(port, args.clients, args.duration))
    finally:
        server.terminate()
        server.wait(timeout=30)
    everything = [value for values in latencies.values() for value in values]
    print(
        f"{args.clients} clients, {elapsed:.1f} s, {args.workers} server process(es), cache {args.cache} s, "
        f"{os.cpu_count()} CPUs: "
        f"{len(everything) / elapsed:,.0f} requests/s, {errors} errors"
    )
    print(
        f"  all       p50 {percentile(everything, 50) * 1e3:7.2f} ms   p99 {percentile(everything, 99) * 1e3:7.2f} ms"
    )
    for name, values in latencies.items():
        print(f"  {name:9} p50 {percentile(values, 50) * 1e3:7.2f} ms   p99 {percentile(values, 99) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
