"""What the true-peak benches (``bench/sp_true_peak.py``, ``tp_true_peak.py``, ``ep_true_peak.py``) share.

Each bench starts its own ranks on gloo CPU ranks (one thread each): the script runs itself with ``--rank CASE_JSON
--out FOLDER`` (:func:`run_ranks`), and rank ``r`` counts live CPU tensor bytes from before the model is built to the
end of the second training step and writes ``FOLDER/rank{r}.json`` (:func:`counted_engine`,
:func:`train_and_report`). The driver keeps the measurements in ``bench/results/NAME.json`` (:func:`bench_args`,
:func:`measured_cases`) and renders them with the current estimator (:func:`estimate_peak`). Imported by name: a
script's own folder is on its path.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tuner.measure.op_builds import environment_ninja_path

RESULTS = Path(__file__).parent / "results"
TINY_QWEN2_MOE = {  # the tiny MoE the true-peak benches train (4 experts, top 2, a shared expert)
    "model_type": "qwen2_moe",
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
Case = dict[str, Any]


def small_bucket_config(stage: int, micro: int, bucket: int, **zero: Any) -> dict[str, Any]:
    """bf16 with AdamW at ZeRO ``stage``, micro-batch ``micro``, one step per batch, buckets of ``bucket`` elements
    (at ZeRO-3 the prefetch and the live parameters limited to it too), so that activations are most of the peak;
    ``zero``: further ``zero_optimization`` keys. A bench adds its parallelism's section."""
    section: dict[str, Any] = {"stage": stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket, **zero}
    if stage == 3:
        section.update(stage3_prefetch_bucket_size=bucket, stage3_max_live_parameters=bucket)
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": section,
    }


# ---------------------------------------------------------------------------------------------------- the driver
def run_ranks(script: str, case: Case, timeout: float) -> dict[str, Any]:
    """Run ``script``'s ranks for ``case`` (``case["world"]`` of them): status, wall seconds, each rank's report
    (None for a rank that wrote none) and, when one is missing, the tail of rank 0's output."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        procs = []
        for rank in range(case["world"]):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(case["world"]),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                PATH=environment_ninja_path(os.environ.get("PATH", os.defpath)),  # the ninja the runs build with
            )
            command = [sys.executable, script, "--rank", json.dumps(case), "--out", scratch]
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outputs = [proc.communicate(timeout=timeout)[0].decode(errors="replace") for proc in procs]
        ranks = []
        for rank in range(case["world"]):
            path = Path(scratch) / f"rank{rank}.json"
            ranks.append(json.loads(path.read_text()) if path.exists() else None)
    status = "ok" if all(ranks) else "error"
    return {
        "status": status,
        "wall_s": time.monotonic() - started,
        "ranks": ranks,
        "error": "" if status == "ok" else outputs[0][-3000:],
    }


def bench_args(
    doc: str, name: str, rank_main: Callable[[Case, Path], None], *, render: bool = False, md: bool = False
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """A bench's flags (``--json``, by default ``bench/results/{name}.json``; ``--only KEY``; ``--remeasure``; with
    ``render`` ``--render``, with ``md`` ``--md``, by default ``bench/results/{name}.md``) and the measurements saved
    in ``--json``. Started as a rank (``--rank CASE_JSON --out FOLDER``, by :func:`run_ranks`), it runs ``rank_main``
    and exits instead."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=RESULTS / f"{name}.json")
    if md:
        parser.add_argument("--md", type=Path, default=RESULTS / f"{name}.md")
    parser.add_argument("--only", default="")
    parser.add_argument("--remeasure", action="store_true")
    if render:
        parser.add_argument("--render", action="store_true", help="only render the table from the saved measurements")
    args = parser.parse_args()
    if args.rank:
        rank_main(json.loads(args.rank), args.out)
        raise SystemExit(0)
    return args, json.loads(args.json.read_text()) if args.json.exists() else {}


def measured_cases(
    cases: Iterable[Case],
    key: Callable[[Case], str],
    measure: Callable[[Case], dict[str, Any]],
    measured: dict[str, Any],
    args: argparse.Namespace,
) -> Iterator[tuple[Case, str, bool]]:
    """Each case whose key holds ``args.only``, with its key and whether it was measured just now: one not in
    ``measured`` yet (every one with ``args.remeasure``) is measured first and ``measured`` saved to ``args.json``."""
    for case in cases:
        case_key = key(case)
        if args.only not in case_key:
            continue
        fresh = case_key not in measured or args.remeasure
        if fresh:
            measured[case_key] = measure(case)
            args.json.write_text(json.dumps(measured, indent=1))
        yield case, case_key, fresh


def estimate_peak(
    model: dict[str, Any],
    name: str,
    world: int,
    seq: int,
    ds: dict[str, Any],
    checkpointing: bool = False,
    attention: str = "sdpa",
) -> Any:
    """dstune's estimate of ``world`` CPU ranks training the transformers model ``model`` (``attention``, bf16) at
    ``seq`` under ``ds`` (the workload carries the model's traced profile at ``seq``, and under the config's
    ``torch_autocast`` where it has one)."""
    from tuner.estimator import estimate
    from tuner.profile import model_from_config, with_profile
    from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload
    from tuner.workload.autocast import autocast_dtype, trace_precision

    cluster = ClusterSpec(gpus_per_node=world, device="cpu", gpu_memory=140 * 2**30)
    train = TrainSpec(seq_len=seq, precision="bf16", attention=attention)
    local = seq // int(ds.get("sequence_parallel_size", 1))  # a rank's tokens, traced as the CLI traces them
    work = with_profile(Workload(model_from_config(model, name=name), cluster, train), lengths=(local,))
    autocast = autocast_dtype(ds, "cpu")
    if autocast:  # traced under the forward pass's torch_autocast, as the CLI traces it
        work = with_profile(work, precisions=(trace_precision("bf16", autocast, "cpu"),), lengths=(local,))
    return estimate(work, TrialConfig(ds, activation_checkpointing=checkpointing))


# ------------------------------------------------------------------------------------------------------ the ranks
def join() -> int:
    """Join the gloo process group :func:`run_ranks` set up, on one thread; this rank's number."""
    import deepspeed
    import torch

    torch.set_num_threads(1)
    deepspeed.init_distributed("gloo")
    return int(os.environ["RANK"])


def counted_engine(
    ds: dict[str, Any],
    model: dict[str, Any],
    detail_env: str,
    *,
    mpu: Any = None,
    adapt: Callable[[Any], None] | None = None,
    attention: str | None = "sdpa",
) -> tuple[Any, Any]:
    """The DeepSpeed engine of the transformers model ``model`` (``attention``; None: the class's own) under ``ds``,
    and the counting allocator (:class:`~tuner.measure.rank.true_peak.CpuAllocatorPeak`; with the environment variable
    ``detail_env`` set, the allocation sites alive at the peak too) started before the model is built. Seed 0; the
    model built where it trains (:mod:`tuner.measure.rank.birth`), handed to ``adapt`` where given, initialised with
    ``mpu``; the counter is marked ``"steps"`` on return."""
    import deepspeed
    import torch

    from tuner.measure.rank.birth import born_on_device, initialise_partitioned
    from tuner.measure.rank.true_peak import CpuAllocatorPeak
    from tuner.profile.hf import build

    torch.manual_seed(0)
    tracker = CpuAllocatorPeak(detail=os.environ.get(detail_env, "") or False)
    tracker.start()
    with born_on_device(ds, "cpu", transformers=True):
        built = build(model, attention=attention)
    initialise_partitioned(built)
    if adapt is not None:
        adapt(built)
    engine, *_ = deepspeed.initialize(model=built, model_parameters=list(built.parameters()), config=ds, mpu=mpu)
    tracker.mark("steps")
    return engine, tracker


def train_and_report(
    engine: Any,
    tracker: Any,
    loss: Callable[[], Any],
    out: Path,
    extra: dict[str, Any] | None = None,
    accumulation: int = 1,
    after: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Two training steps of ``loss()``, each of ``accumulation`` micro-steps (the counter marked ``"step N
    forward"``, ``"backward"``, ``"step"``; ``"step N micro M forward"``... with accumulation), then this rank's report
    (the counted peak, the losses, ``extra`` and what ``after()`` reads once the steps are done) to
    ``out/rank{RANK}.json``; waits for the rest."""
    import torch

    losses = []
    for micro_step in range(2 * accumulation):
        step, micro = divmod(micro_step, accumulation)
        label = f"step {step}" + (f" micro {micro}" if accumulation > 1 else "")
        tracker.mark(f"{label} forward")
        value = loss()
        tracker.mark(f"{label} backward")
        engine.backward(value)
        tracker.mark(f"{label} step")
        engine.step()
        losses.append(float(value))
    report = tracker.stop()
    report.update(losses=losses, **(extra or {}), **(after() if after is not None else {}))
    report["phase_peaks"] = tracker.phase_peaks  # each phase's own high-water mark (where a micro-step's fell)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(report, default=str))
    torch.distributed.barrier()
