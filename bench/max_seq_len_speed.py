"""Seconds ``dstune estimate --max-seq-len`` takes, cold (an empty profile cache: torch and transformers imported,
the model traced) and warm (the same cache again), wall and CPU, as a user runs it: one ``dstune`` process each.

Each case runs ``--passes`` times (fresh cache folders for the cold ones); medians are printed. ``--tree PATH`` (given
twice or more) runs the same cases with each source tree on ``PYTHONPATH``, interleaved pass by pass so that a load
on the machine falls on every tree alike, and checks that their answers (``max_seq_len`` objects without the
search's counters) are identical. The target: under 30 s wall cold for a 7-8B model.

``--api``: the same question put to the HTTP API (``POST /v1/estimate``, an inline ``config.json``, ``seq_len:
"max"``) on a new app each time, timing the request with the profile waited for.

Run: ``.venv/bin/python bench/max_seq_len_speed.py [--passes 3] [--tree OLD --tree NEW] [--case "1 GPU" ...] [--api]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA_31_8B = str(Path(__file__).with_name("configs") / "llama-3.1-8b" / "config.json")
CASES = {  # name: the estimate flags (a Llama-3.1-8B-shaped transformers config.json)
    "1 GPU": ["--model", LLAMA_31_8B, "--gpus", "1"],
    "8 GPUs": ["--model", LLAMA_31_8B, "--gpus", "8"],
    "8 GPUs, --stage 3": ["--model", LLAMA_31_8B, "--gpus", "8", "--stage", "3"],
    "8 GPUs, --sequence-parallel 8": ["--model", LLAMA_31_8B, "--gpus", "8", "--sequence-parallel", "8"],
}
COUNTERS = ("candidates", "refused", "tied", "estimates")  # how the search went, not what it answers
API_CASES = {"1 GPU": 1, "8 GPUs": 8}  # the cases --api runs: an inline config.json, seq_len "max"
API_CHILD = """
import json, sys, time
from fastapi.testclient import TestClient
from tuner.api import create_app
app = create_app(f"sqlite:///{sys.argv[2]}/api.db", "tok", recommend_cache_s=0, request_budget_s=900)
with TestClient(app) as client:
    start = time.perf_counter()
    response = client.post("/v1/estimate", json=json.loads(sys.argv[1]))
    wall = time.perf_counter() - start
print(json.dumps({"wall": wall, "status": response.status_code, "body": response.json()}))
"""


def run(tree: str | None, flags: list[str], cache: str) -> tuple[float, float, dict]:
    """One ``dstune estimate --max-seq-len --json``: wall seconds, CPU seconds (user + system) and its answer."""
    env = {**os.environ, "DSTUNE_PROFILE_CACHE": cache}
    if tree:
        env["PYTHONPATH"] = tree
    command = [str(Path(sys.executable).with_name("dstune")), "estimate", *flags, "--max-seq-len", "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    answer = json.loads(done.stdout)["max_seq_len"]
    return wall, cpu, {key: value for key, value in answer.items() if key not in COUNTERS}


def run_api(tree: str | None, gpus: int, cache: str) -> tuple[float, float, dict]:
    """One ``POST /v1/estimate`` with ``seq_len: "max"`` on a new app (in-process client, the real profiling
    service): the request's wall seconds (the profile waited for, not answered 503), the CPU of the whole process
    and its workers, and its answer."""
    env = {**os.environ, "DSTUNE_PROFILE_CACHE": cache, "DSTUNE_PROFILE_WAIT_S": "900"}
    if tree:
        env["PYTHONPATH"] = tree
    config = json.loads(Path(LLAMA_31_8B).read_text())
    body = {"workload": {"config": config, "gpus": gpus, "seq_len": "max"}}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-c", API_CHILD, json.dumps(body), cache]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the API child failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["status"] != 200:
        raise SystemExit(f"the API answered {result['status']}: {result['body']}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    answer = result["body"]["max_seq_len"]
    return result["wall"], cpu, {key: value for key, value in answer.items() if key not in COUNTERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--tree", action="append", help="a source tree to run (PYTHONPATH); default: the installed")
    parser.add_argument("--case", action="append", choices=list(CASES), help="default: every case")
    parser.add_argument("--api", action="store_true", help='POST /v1/estimate with seq_len "max" instead of the CLI')
    args = parser.parse_args()
    trees = args.tree or [None]
    cases = args.case or list(API_CASES if args.api else CASES)
    times: dict[tuple[str | None, str, str], list[tuple[float, float]]] = {}
    answers: dict[tuple[str | None, str], dict] = {}
    for _ in range(args.passes):
        for case in cases:
            for tree in trees:
                with tempfile.TemporaryDirectory() as cache:
                    for kind in ("cold", "warm"):
                        if args.api:
                            wall, cpu, answer = run_api(tree, API_CASES[case], cache)
                        else:
                            wall, cpu, answer = run(tree, CASES[case], cache)
                        times.setdefault((tree, case, kind), []).append((wall, cpu))
                        answers.setdefault((tree, case), answer)
                        if answers[tree, case] != answer:
                            raise SystemExit(f"{case}: {tree} answered differently cold and warm")
    print(f"{'tree':<28} {'case':<30} {'kind':<5} {'wall s (median)':>15} {'CPU s (median)':>14} {'seq_len':>9}")
    for case in cases:
        for tree in trees:
            for kind in ("cold", "warm"):
                runs = times[tree, case, kind]
                wall = statistics.median(w for w, _ in runs)
                cpu = statistics.median(c for _, c in runs)
                name = (tree or "installed")[-28:]
                print(
                    f"{name:<28} {case:<30} {kind:<5} {wall:>15.1f} {cpu:>14.1f} {answers[tree, case]['seq_len']:>9,}"
                )
        if len({json.dumps(answers[tree, case], sort_keys=True) for tree in trees}) > 1:
            raise SystemExit(f"{case}: the trees answer differently")
    print(f"{args.passes} passes; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
