"""Load test of ``POST /v1/recommend``: 100 concurrent clients on loopback against a database of 10,000 trials.

Seeds a fresh SQLite database (or the PostgreSQL database given by ``--url``) with ``--trials`` trials over 16
workloads of GPT-2 (one study each: ok, pruned and out-of-memory trials, real estimates in their rows) and starts
``dstune serve`` on 127.0.0.1. ``--clients`` clients (aiohttp, one connection each, one asyncio loop in this process)
cycle through three requests, one per answer source: a workload with measurements (``measured``), the same model on
an unmeasured cluster (``nearest``) and a model with no measurements at all (``estimate``).

Two kinds of load, each for ``--duration`` seconds:

- **closed loop** (the issue's test): every client sends its next request as soon as the previous answer arrives.
  Latency is then the number of clients over the throughput (Little's law): it measures the server's capacity.
- **open loop** at ``--rates`` requests/s: requests are due at a fixed pace spread over the clients, and latency is
  counted from when a request was due (a late client's wait is included: no coordinated omission). This is what a
  fleet of training launchers asking for their config looks like at that rate.

Side by side, in the same run, the same loads go to a **floor** server (``bench/api_floor.py``): the same route and
request validation answering a constant, so the figures show what dstune costs on top of uvicorn and FastAPI on
this machine. Prints requests/s, p50 and p99 (overall and per source) for each. Target: p99 under 25 ms.

Run: ``.venv/bin/python bench/api_load.py [--duration 30] [--clients 100] [--rates 500,1000,2000] [--workers 1]
[--url postgresql+psycopg://...]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from tuner.estimator import estimate
from tuner.recommend import normalised
from tuner.schema import WorkloadRequest, to_workload
from tuner.storage import Store, StudyRow, TrialRow, utcnow

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


def start_server(command: list[str], port: int) -> subprocess.Popen:
    """Start a server and wait until ``/v1/recommend`` answers."""
    env = {**os.environ, "DSTUNE_API_TOKEN": "bench-token"}
    server = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"http://127.0.0.1:{port}/v1/recommend", json=REQUESTS["measured"], timeout=5).is_success:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit(f"the server did not come up: {command}")


def dstune_command(url: str, port: int, workers: int, cache_s: float) -> list[str]:
    command = [DSTUNE, "serve", "--storage", url, "--port", str(port), "--log-level", "warning"]
    return [*command, "--recommend-cache", str(cache_s), "--workers", str(workers)]


def floor_command(port: int, workers: int) -> list[str]:
    bench = str(Path(__file__).parent)
    command = [sys.executable, "-m", "uvicorn", "api_floor:app", "--app-dir", bench, "--port", str(port)]
    return [*command, "--log-level", "warning", "--workers", str(workers)]


Latencies = dict[str, list[float]]


async def load(port: int, clients: int, duration: float, rate: float | None) -> tuple[Latencies, int, float]:
    """``clients`` clients for ``duration`` seconds, closed loop (``rate`` None) or open loop at ``rate`` requests/s
    in all: latencies (seconds) by source, errors, elapsed seconds."""
    latencies: Latencies = {name: [] for name in REQUESTS}
    bodies = {name: json.dumps(body).encode() for name, body in REQUESTS.items()}
    headers = {"content-type": "application/json"}
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector) as session:
        for name, body in bodies.items():  # check each answers with its source
            async with session.post("/v1/recommend", data=body, headers=headers) as response:
                answer = await response.json()
            assert answer["source"] == name or answer["study"] == "floor", (name, answer)

        async def warm_up() -> None:  # every client's connection open before the clock starts
            async with session.post("/v1/recommend", data=bodies["measured"], headers=headers) as response:
                await response.read()

        await asyncio.gather(*(warm_up() for _ in range(clients)))
        gc.collect()
        gc.freeze()  # this process's own start-up objects: its collector pauses are not the server's latency
        started = time.perf_counter()
        end = started + duration

        async def client(index: int) -> None:
            nonlocal errors
            names = itertools.islice(itertools.cycle(REQUESTS), index % len(REQUESTS), None)
            for sent, name in enumerate(names):
                due = time.perf_counter() if rate is None else started + (sent * clients + index) / rate
                if due >= end:
                    return
                if due > time.perf_counter():
                    await asyncio.sleep(due - time.perf_counter())
                async with session.post("/v1/recommend", data=bodies[name], headers=headers) as response:
                    await response.read()
                    errors += response.status != 200
                latencies[name].append(time.perf_counter() - due)

        await asyncio.gather(*(client(index) for index in range(clients)))
    return latencies, errors, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1] if len(values) > 1 else values[0]


def report(server: str, load_name: str, latencies: Latencies, errors: int, elapsed: float) -> None:
    everything = [value for values in latencies.values() for value in values]
    sources = "  ".join(
        f"{name} {percentile(values, 50) * 1e3:.1f}/{percentile(values, 99) * 1e3:.1f}"
        for name, values in latencies.items()
    )
    print(
        f"| {server:6} | {load_name:14} | {len(everything) / elapsed:7,.0f} | {percentile(everything, 50) * 1e3:7.2f} "
        f"| {percentile(everything, 99) * 1e3:8.2f} | {errors} | {sources} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of each load (default 30)")
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients (default 100)")
    parser.add_argument("--rates", default="500,1000,2000", help="open-loop rates, requests/s in all ('' for none)")
    parser.add_argument("--trials", type=int, default=10_000, help="trials in the database (default 10,000)")
    parser.add_argument("--workers", type=int, default=1, help="server processes, both servers (default 1)")
    parser.add_argument("--cache", type=float, default=2.0, help="server's --recommend-cache seconds (0: off)")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor server")
    parser.add_argument("--url", help="an empty PostgreSQL database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",") if rate.strip()]
    url = args.url or f"sqlite:///{Path(tempfile.mkdtemp(prefix='dstune-bench-')) / 'dstune.db'}"
    t0 = time.perf_counter()
    seed(url, args.trials)
    print(f"seeded {args.trials} trials in {time.perf_counter() - t0:.1f} s ({url.split(':')[0]})")
    print(
        f"{args.clients} clients, {args.duration:.0f} s per load, {args.workers} server process(es), "
        f"recommend cache {args.cache} s, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start\n"
    )
    print("| server | load           |   req/s | p50 ms  |   p99 ms | errors | p50/p99 ms by source |")
    print("|---|---|---:|---:|---:|---:|---|")
    servers = {"dstune": lambda port: dstune_command(url, port, args.workers, args.cache)}
    if not args.no_floor:
        servers["floor"] = lambda port: floor_command(port, args.workers)
    loads: list[tuple[str, float | None]] = [("closed loop", None), *((f"open {r:,.0f}/s", r) for r in rates)]
    for load_name, rate in loads:  # the two servers alternate under each load: the machine's noise hits both
        for server_name, command in servers.items():
            port = free_port()
            server = start_server(command(port), port)
            try:
                latencies, errors, elapsed = asyncio.run(load(port, args.clients, args.duration, rate))
            finally:
                server.terminate()
                server.wait(timeout=30)
            report(server_name, load_name, latencies, errors, elapsed)


if __name__ == "__main__":
    main()
