"""An independent timing of a study's top configs under a real launcher's environment, to check that the study's
winner is the fastest under the same threads.

Independent of dstune's runner: each config is trained by plain ``deepspeed.initialize`` on gloo ranks that the real
launcher starts (``deepspeed --num_gpus 2`` or ``torchrun --nproc_per_node 2``, from this venv), so the launcher's own
rules give the ranks their threads; ``--omp N`` puts ``OMP_NUM_THREADS=N`` in the launcher's environment, as a user's
shell would. Each rank reports ``torch.get_num_threads()``, ``OMP_NUM_THREADS`` and its CPU affinity, read inside the
rank (the truth for what it ran with). The model is the tiny LLaMA preset's config built by transformers, on seeded
random tokens; a step is the config's accumulation micro-steps, timed on every rank and taken as the slowest rank's
(as a synchronous data-parallel step is); the optimizer step (the boundary ``engine.step()``, where CPU Adam runs
under optimizer offload) is timed on its own. Medians over the timed steps.

Run: ``python bench/launch_env_check.py --study le-deepspeed --storage sqlite:///x.db --top 3 --launcher deepspeed``
or ``--config FILE.json`` (one ds_config) for a single config; the JSON result goes to ``--out`` and stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRESET = Path(__file__).resolve().parents[1] / "tuner" / "workload" / "presets" / "tiny-llama.json"
BIN = Path(sys.executable).parent


def rank_main(config_path: str, out_path: str, seq: int, warmup: int, steps: int) -> None:
    """One rank: build the model, ``deepspeed.initialize``, warm up, time ``steps`` steps; rank 0 writes the result."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    ds_config = json.loads(Path(config_path).read_text())
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    preset = json.loads(PRESET.read_text())
    config = AutoConfig.for_model(preset.pop("model_type"), **preset)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    generator = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, config.vocab_size, (micro, seq), generator=generator) for _ in range(accum)]
    step_times, optimizer_times = [], []
    for index in range(warmup + steps):
        begin = time.perf_counter()
        optimizer_s = 0.0
        for micro_index, batch in enumerate(batches):
            engine.backward(engine(input_ids=batch, labels=batch).loss)
            boundary = time.perf_counter()
            engine.step()
            if micro_index == accum - 1:
                optimizer_s = time.perf_counter() - boundary
        spent = torch.tensor([time.perf_counter() - begin, optimizer_s])
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)  # the slowest rank sets a synchronous step
        if index >= warmup:
            step_times.append(float(spent[0]))
            optimizer_times.append(float(spent[1]))
    report = {
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    reports: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    if rank == 0:
        tokens = micro * accum * dist.get_world_size() * seq
        median = statistics.median(step_times)
        result = {
            "step_times": step_times,
            "median_step_s": median,
            "median_optimizer_step_s": statistics.median(optimizer_times),
            "tokens_per_s": tokens / median,
            "ranks": reports,
        }
        Path(out_path).write_text(json.dumps(result))
    dist.barrier()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(ds_config: dict[str, Any], launcher: str, omp: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``ds_config`` on 2 gloo ranks started by the real ``launcher``; the rank 0 result."""
    with tempfile.TemporaryDirectory(prefix="launch-env-check-") as scratch:
        config, out = Path(scratch) / "ds_config.json", Path(scratch) / "result.json"
        config.write_text(json.dumps(ds_config))
        tail = [__file__, "--rank-main", str(config), str(out), "--seq", str(args.seq)]
        tail += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
        port = str(free_port())
        if launcher == "deepspeed":
            command = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", port, *tail]
        else:
            command = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", port, *tail]
        env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
        env["DS_ACCELERATOR"] = "cpu"
        if omp is not None:
            env["OMP_NUM_THREADS"] = str(omp)
        # a session of its own: at the timeout the launcher and its ranks (and their op builds) go together
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            output, _ = process.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return {"error": f"timed out after {args.timeout:.0f} s"}
        if process.returncode != 0 or not out.exists():
            return {"error": output[-2000:]}
        return json.loads(out.read_text())


def study_configs(study: str, storage: str, top: int) -> list[tuple[str, dict[str, Any], float]]:
    """The study's ``top`` measured configs, fastest first: (trial, the ds_config DeepSpeed gets, its tokens/s)."""
    from tuner.storage import Store

    store = Store.open(storage)
    record = store.get_study(study)
    if record is None:
        raise SystemExit(f"no study {study!r} in {storage}")
    trials = store.trials(record.id, status="ok", order_by="-tokens_per_s", limit=top)
    return [(f"trial {t.number}", t.trial.deepspeed_config(), float(t.tokens_per_s)) for t in trials]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank-main", nargs=2, metavar=("CONFIG", "OUT"))
    parser.add_argument("--local_rank", type=int)  # the deepspeed launcher passes it
    parser.add_argument("--study")
    parser.add_argument("--storage", default="sqlite:///dstune.db")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--config", help="one ds_config JSON file instead of a study's configs")
    parser.add_argument("--launcher", choices=("deepspeed", "torchrun"), default="deepspeed")
    parser.add_argument("--omp", type=int, nargs="*", default=[None], help="OMP_NUM_THREADS values to run under")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1, help="times every config is run, interleaved round-robin")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.rank_main:
        rank_main(*args.rank_main, args.seq, args.warmup, args.steps)
        return
    if args.config:
        configs = [(Path(args.config).name, json.loads(Path(args.config).read_text()), float("nan"))]
    else:
        configs = study_configs(args.study, args.storage, args.top)
    rows = []
    for round_ in range(args.rounds):  # round-robin: a slow spell of the machine hits every config alike
        for name, ds_config, study_tokens in configs:
            for omp in args.omp:
                result = launch(ds_config, args.launcher, omp, args)
                rows.append({"config": name, "study_tokens_per_s": study_tokens, "omp": omp, "round": round_, **result})
                print(json.dumps(rows[-1]), flush=True)
    summary = {"launcher": args.launcher, "rows": rows, "medians": medians(rows)}
    if summary["medians"]:
        summary["fastest"] = max(summary["medians"], key=lambda row: row["tokens_per_s"])["config"]
    print(json.dumps({key: summary[key] for key in ("medians", "fastest") if key in summary}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per config and thread count, the median over the rounds of each run's tokens/s and optimizer step."""
    groups: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    for row in rows:
        if "tokens_per_s" in row:
            groups.setdefault((row["config"], row["omp"]), []).append(row)
    return [
        {
            "config": name,
            "omp": omp,
            "study_tokens_per_s": group[0]["study_tokens_per_s"],
            "runs": len(group),
            "tokens_per_s": statistics.median(row["tokens_per_s"] for row in group),
            "tokens_per_s_runs": [round(row["tokens_per_s"]) for row in group],
            "optimizer_step_s": statistics.median(row["median_optimizer_step_s"] for row in group),
            "threads": group[0]["ranks"][0]["threads"],
        }
        for (name, omp), group in groups.items()
    ]


if __name__ == "__main__":
    main()
