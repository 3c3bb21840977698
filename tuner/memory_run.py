"""Measure where a real DeepSpeed run's bytes are, by category and phase, on CPU ranks (gloo).

Each call starts fresh processes, one per rank, builds the built-in model for the workload, runs one warm-up step
(so Adam's states exist) and one recorded step, and returns every rank's snapshots from
:class:`tuner.memory_probe.PhaseRecorder`. This is the ground truth the estimator's tests compare against.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
from pathlib import Path
from typing import Any

from tuner.workload import Workload

DEFAULT_EXTENSIONS_DIR = Path(__file__).resolve().parent.parent / ".cache" / "torch_extensions"


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, workload: Workload, ds_config: dict[str, Any], out: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        DS_ACCELERATOR="cpu",
    )
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(DEFAULT_EXTENSIONS_DIR))
    try:
        import logging
        from datetime import timedelta

        import deepspeed
        import torch
        from deepspeed.utils import logger

        from tuner.memory_probe import PhaseRecorder
        from tuner.models import build_model, synthetic_batch

        logger.setLevel(logging.ERROR)
        torch.set_num_threads(1)
        deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=120))
        torch.manual_seed(0)
        train = workload.train
        model = build_model(workload.model, attention=train.attention, checkpointing=train.activation_checkpointing)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        batch = synthetic_batch(workload.model, engine.train_micro_batch_size_per_gpu(), train.seq_len, seed=rank)
        recorder = PhaseRecorder(engine)
        loss = engine(*batch)
        engine.backward(loss)
        engine.step()
        recorder.train_step(*batch)
        out.put(
            (
                rank,
                {
                    "snapshots": recorder.snapshots,
                    "activations": recorder.activation_bytes,
                    "optimizer": type(engine.optimizer).__name__,
                },
            )
        )
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    except BaseException as error:  # reported to the parent, which raises it
        out.put((rank, {"error": f"{type(error).__name__}: {error}"}))
        raise


def measure_memory(workload: Workload, ds_config: dict[str, Any], timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run one recorded DeepSpeed step on ``workload.cluster.world_size`` CPU ranks; one result per rank.

    Raises:
        RuntimeError: a rank failed (its error is in the message) or the run passed ``timeout`` seconds.
    """
    world = workload.cluster.world_size
    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank_main, args=(r, world, port, workload, ds_config, out)) for r in range(world)]
    for process in ranks:
        process.start()
    results: dict[int, dict[str, Any]] = {}
    try:
        while len(results) < world:
            try:
                rank, result = out.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"memory run timed out after {timeout:.0f} s") from None
            if "error" in result:
                raise RuntimeError(f"rank {rank} failed: {result['error']}")
            results[rank] = result
        for process in ranks:
            process.join(timeout=60)
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
    return [results[rank] for rank in range(world)]
