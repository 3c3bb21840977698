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

``--hostile N`` repeats each load with N more clients in flight sending a **hostile mix**:
plausible-looking workloads that once cost seconds of CPU, gigabytes or a 500 (a billion-layer inline config, ten
million layers, 4096 × 4096 GPUs at 2^20 tokens), and the most costly ones validation lets through (131,072 GPUs at
2^20 tokens, the largest inline config within every dimension limit, a new one each time so the profiling service
traces each, huge ds_config and batch numbers). Each hostile request is varied so no cache answers it. The normal
clients' p50/p99 is reported with and without them, and the hostile requests' latency and statuses by case. The server
gets a fresh profile cache (a copy of ``$DSTUNE_PROFILE_CACHE``), so hostile profiles land nowhere else.

Side by side, in the same run, the same loads go to a **floor** server (``bench/api_floor.py``): the same route and
request validation answering a constant, so the figures show what dstune costs on top of uvicorn and FastAPI on
this machine. Prints requests/s, p50 and p99 (overall and per source) for each. Target: p99 under 25 ms.

Run: ``.venv/bin/python bench/api_load.py [--duration 30] [--clients 100] [--rates 500,1000,2000] [--workers 1]
[--hostile 100] [--url postgresql+psycopg://...]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import shutil
import signal
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
from tuner.requests import WorkloadRequest, to_workload
from tuner.storage import Store, StudyRow, TrialRow, utcnow

GPT2 = {"model": "gpt2", "seq_len": 512}
REQUESTS = {
    "measured": {"workload": {**GPT2, "gpus": 2, "gpu_memory": "24GiB"}},
    "nearest": {"workload": {**GPT2, "gpus": 16, "gpu_memory": "24GiB"}},
    "estimate": {"workload": {"model": "llama-2-7b", "gpus": 8, "seq_len": 4096}},
}
DSTUNE = str(Path(sys.executable).with_name("dstune"))
LLAMA = json.loads((Path(__file__).parents[1] / "tuner" / "workload" / "presets" / "llama-2-7b.json").read_text())
MAX_DIMS = {"hidden_size": 2**17, "intermediate_size": 2**19, "num_attention_heads": 1024, "num_key_value_heads": 1024}


def hostile_request(case: str, variant: int) -> tuple[str, dict]:
    """The endpoint and body of a hostile case; ``variant`` makes each one new to every cache."""
    name = f"hostile-{variant}"
    if case == "1e9 layers (transformers)":
        return "/v1/estimate", {"workload": {"config": {**LLAMA, "num_hidden_layers": 10**9, "_name_or_path": name}}}
    if case == "1e9 layers (builtin)":
        config = {**LLAMA, "num_hidden_layers": 10**9, "_name_or_path": name}
        return "/v1/estimate", {"workload": {"config": config, "model_impl": "builtin"}}
    if case == "1e7 layers (builtin)":
        config = {**LLAMA, "num_hidden_layers": 10**7, "_name_or_path": name}
        return "/v1/estimate", {"workload": {"config": config, "model_impl": "builtin"}}
    if case == "4096x4096 GPUs, 2^20 tokens":
        workload = {"model": "llama-2-7b", "seq_len": 2**20 - variant % 1024, "gpus": 4096, "nodes": 4096}
        return "/v1/recommend", {"workload": workload}
    if case == "131072 GPUs, 2^20 tokens":  # the largest world and sequence validation lets through
        workload = {"model": "llama-2-7b", "seq_len": 2**20 - variant % 2**19, "gpus": 4096, "nodes": 32}
        return "/v1/recommend", {"workload": {**workload, "model_impl": "builtin"}}
    if case == "2^56 params in limits":  # every dimension within its limit, the product counted, not built
        config = {**LLAMA, "num_hidden_layers": 1024, "num_attention_heads": 4096, "head_dim": 2**17}
        return "/v1/estimate", {"workload": {"config": {**config, "_name_or_path": name}}}
    if case == "largest valid config (transformers)":  # a new model each time: traced by the profiling service
        config = {**LLAMA, **MAX_DIMS, "num_hidden_layers": 1024, "vocab_size": 2**22 - variant}
        return "/v1/recommend", {"workload": {"config": config}}
    if case == "huge ds_config and batch":
        workload = {"model": "llama-2-7b", "model_impl": "builtin", "seq_len": 2**20, "attention": "eager"}
        workload |= {"micro_batch": 2**16, "grad_accum": 2**16 - variant % 1024}
        zero = {"stage": 3, "stage3_param_persistence_threshold": 10**15, "sub_group_size": 10**18}
        return "/v1/estimate", {"workload": workload, "stage": 3, "ds_config": {"zero_optimization": zero}}
    raise KeyError(case)


HOSTILE_CASES = (
    "1e9 layers (transformers)",
    "1e9 layers (builtin)",
    "1e7 layers (builtin)",
    "4096x4096 GPUs, 2^20 tokens",
    "131072 GPUs, 2^20 tokens",
    "2^56 params in limits",
    "largest valid config (transformers)",
    "huge ds_config and batch",
)


def seed(url: str, n_trials: int) -> None:
    """``n_trials`` trials spread over 16 GPT-2 workloads (GPUs × memory × sequence length), one study each."""
    store = Store.open(url)
    shapes = list(itertools.product((1, 2, 4, 8), ("24GiB", "80GiB"), (512, 1024)))
    per_study = n_trials // len(shapes)
    configs = list(itertools.product((0, 1, 2, 3), (1, 2, 4, 8, 16), (1, 2, 4, 8)))
    now = utcnow()
    for index, (gpus, memory, seq_len) in enumerate(shapes):
        workload = to_workload(WorkloadRequest(model="gpt2", gpus=gpus, gpu_memory=memory, seq_len=seq_len))
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


def fresh_profile_cache() -> str:
    """A copy of the profile cache the server would use, in a temporary folder (hostile profiles land there)."""
    source = Path(os.environ.get("DSTUNE_PROFILE_CACHE") or Path.home() / ".cache" / "dstune" / "profiles")
    target = Path(tempfile.mkdtemp(prefix="dstune-bench-profiles-")) / "profiles"
    if source.is_dir():
        shutil.copytree(source, target)
    return str(target)


def start_server(command: list[str], port: int) -> subprocess.Popen:
    """Start a server (on a fresh copy of the profile cache) and wait until ``/v1/recommend`` answers."""
    env = {**os.environ, "DSTUNE_API_TOKEN": "bench-token", "DSTUNE_PROFILE_CACHE": fresh_profile_cache()}
    server = subprocess.Popen(command, env=env, start_new_session=True)  # its own group: stopped with its children
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"http://127.0.0.1:{port}/v1/recommend", json=REQUESTS["measured"], timeout=5).is_success:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    stop(server)
    raise SystemExit(f"the server did not come up: {command}")


def stop(server: subprocess.Popen) -> None:
    """Stop a server started by :func:`start_server`, and its children (the profiling worker)."""
    server.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


def dstune_command(url: str, port: int, workers: int, cache_s: float) -> list[str]:
    command = [DSTUNE, "serve", "--storage", url, "--port", str(port), "--log-level", "warning"]
    return [*command, "--recommend-cache", str(cache_s), "--workers", str(workers)]


def floor_command(port: int, workers: int) -> list[str]:
    bench = str(Path(__file__).parent)
    command = [sys.executable, "-m", "uvicorn", "api_floor:app", "--app-dir", bench, "--port", str(port)]
    return [*command, "--log-level", "warning", "--workers", str(workers)]


Latencies = dict[str, list[float]]
Statuses = dict[str, dict[int, int]]


async def hostile_load(port: int, clients: int, end: float, latencies: Latencies, statuses: Statuses) -> None:
    """``clients`` closed-loop clients cycling through :data:`HOSTILE_CASES` until ``end``; every request is new."""
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector, timeout=timeout) as session:

        async def client(index: int) -> None:
            for sent in itertools.count():
                if time.perf_counter() >= end:
                    return
                case = HOSTILE_CASES[(index + sent) % len(HOSTILE_CASES)]
                path, body = hostile_request(case, sent * clients + index)
                started = time.perf_counter()
                try:
                    async with session.post(path, json=body) as response:
                        await response.read()
                        status = response.status
                except (aiohttp.ClientError, TimeoutError):
                    status = 0  # no answer: connection refused or reset, or over two minutes
                latencies[case].append(time.perf_counter() - started)
                statuses[case][status] = statuses[case].get(status, 0) + 1

        await asyncio.gather(*(client(index) for index in range(clients)))


async def load(
    port: int, clients: int, duration: float, rate: float | None, hostile: int = 0
) -> tuple[Latencies, int, float, Latencies, Statuses]:
    """``clients`` clients for ``duration`` seconds, closed loop (``rate`` None) or open loop at ``rate`` requests/s
    in all, beside ``hostile`` hostile clients: latencies (seconds) by source, errors, elapsed seconds, and the hostile
    requests' latencies and statuses by case."""
    hostile_latencies: Latencies = {case: [] for case in HOSTILE_CASES}
    hostile_statuses: Statuses = {case: {} for case in HOSTILE_CASES}
    latencies: Latencies = {name: [] for name in REQUESTS}
    bodies = {name: json.dumps(body).encode() for name, body in REQUESTS.items()}
    headers = {"content-type": "application/json"}
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector) as session:
        for name, body in bodies.items():  # check each answers with its source (a new profile: 503 first)
            for _ in range(30):
                async with session.post("/v1/recommend", data=body, headers=headers) as response:
                    answer = await response.json()
                if response.status != 503:
                    break
                await asyncio.sleep(int(response.headers.get("Retry-After", "5")))
            assert answer["source"] == name or answer["study"] == "floor", (name, answer)

        async def warm_up() -> None:  # every client's connection open before the clock starts
            async with session.post("/v1/recommend", data=bodies["measured"], headers=headers) as response:
                await response.read()

        await asyncio.gather(*(warm_up() for _ in range(clients)))
        gc.collect()
        gc.freeze()  # this process's own start-up objects: its collector pauses are not the server's latency
        started = time.perf_counter()
        end = started + duration
        hostiles = asyncio.ensure_future(
            hostile_load(port, hostile, end, hostile_latencies, hostile_statuses) if hostile else asyncio.sleep(0)
        )

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
        elapsed = time.perf_counter() - started
        await hostiles  # the hostile requests still in flight finish (or time out) before the server stops
    return latencies, errors, elapsed, hostile_latencies, hostile_statuses


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


def report_hostile(load_name: str, latencies: Latencies, statuses: Statuses) -> None:
    for case in HOSTILE_CASES:
        values = latencies[case]
        if not values:
            continue
        answered = ", ".join(f"{count}× {status or 'none'}" for status, count in sorted(statuses[case].items()))
        print(
            f"| {load_name} | {case} | {len(values)} | {answered} | {percentile(values, 50) * 1e3:,.1f} "
            f"| {percentile(values, 99) * 1e3:,.1f} | {max(values) * 1e3:,.1f} |",
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
    parser.add_argument("--no-closed", action="store_true", help="skip the closed-loop load")
    parser.add_argument("--hostile", type=int, default=0, help="repeat each load beside N hostile clients (0: no)")
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
    if args.no_closed:
        loads = loads[1:]
    hostile_rows: list[tuple[str, Latencies, Statuses]] = []
    for load_name, rate in loads:  # the two servers alternate under each load: the machine's noise hits both
        for hostile in (0, args.hostile) if args.hostile else (0,):
            for server_name, command in servers.items():
                if hostile and server_name == "floor":
                    continue
                port = free_port()
                server = start_server(command(port), port)
                try:
                    latencies, errors, elapsed, bad, statuses = asyncio.run(
                        load(port, args.clients, args.duration, rate, hostile)
                    )
                finally:
                    stop(server)
                name = f"{load_name} + {hostile} hostile" if hostile else load_name
                report(server_name, name, latencies, errors, elapsed)
                if hostile:
                    hostile_rows.append((name, bad, statuses))
    if hostile_rows:
        print("\n| load | hostile case | requests | statuses | p50 ms | p99 ms | max ms |")
        print("|---|---|---:|---|---:|---:|---:|")
        for name, bad, statuses in hostile_rows:
            report_hostile(name, bad, statuses)


if __name__ == "__main__":
    main()
