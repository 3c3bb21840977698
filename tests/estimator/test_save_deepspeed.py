"""The save phase against real DeepSpeed: what rank 0's consolidated 16-bit state_dict holds on 2 CPU ranks.

One or two gloo ranks build tiny models under ZeRO-3 and call ``engine._zero3_consolidated_16bit_state_dict()`` (what
``save_16bit_model`` saves with ``stage3_gather_16bit_weights_on_model_save``). Rank 0 reports the bytes of the
distinct storages behind the parameters in its state_dict (the gathered model, tied weights once) and those not
shared with a live parameter (what gathering added to its memory on CPU ranks, where ``.cpu()`` copies nothing).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from tuner.estimator import estimate
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

pytestmark = pytest.mark.deepspeed

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from datetime import timedelta

    import deepspeed, torch

    from tuner.measure.rank.birth import born_on_device
    from tuner.measure.rank.models import build_model
    from tuner.workload import load_builtin_model

    model_name, config, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=120))
    with born_on_device(config, "cpu"):
        model = build_model(load_builtin_model(model_name))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    state = engine._zero3_consolidated_16bit_state_dict()
    if engine.global_rank == 0:
        names = {name for name, _ in engine.module.named_parameters(remove_duplicate=False)}
        live = set()
        for param in engine.module.parameters():
            live.add(param.data.untyped_storage().data_ptr())
            live.add(param.ds_tensor.untyped_storage().data_ptr())
        storages = {}
        for name, tensor in state.items():
            if name in names:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        extra = sum(size for pointer, size in storages.items() if pointer not in live)
        with open(out, "w") as file:
            json.dump({"gathered": sum(storages.values()), "extra": extra, "keys": len(state)}, file)
    torch.distributed.barrier()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: gloo's threads abort it ("terminate called without an active exception")
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(tmp_path: Path, model: str, config: dict, world: int = 2, timeout: float = 240) -> dict:
    script, out = tmp_path / "save.py", tmp_path / "save.json"
    script.write_text(SCRIPT)
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), model, json.dumps(config), str(out)],
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        logs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert all(proc.returncode == 0 for proc in procs), "\n".join(log[-3000:] for log in logs)
    return json.loads(out.read_text())


@pytest.mark.parametrize(("model", "world"), [("tiny-gpt2", 2), ("tiny-llama", 2), ("tiny-llama", 1)])
def test_save_phase_matches_the_consolidated_state_dict(tmp_path: Path, model: str, world: int) -> None:
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 2 * world,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 50_000,
            "stage3_prefetch_bucket_size": 50_000,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }
    workload = Workload(
        load_builtin_model(model), ClusterSpec(gpus_per_node=world, device="cpu"), TrainSpec(seq_len=64)
    )
    est = estimate(workload, config)
    measured = run_ranks(tmp_path, model, config, world)
    assert measured["gathered"] == pytest.approx(2 * workload.model.n_params, rel=0.01)  # e·Ψ, tied weights once
    assert measured["extra"] == pytest.approx(est.details["save_gathered_model"], rel=0.01)  # no live parameter
    host = est.phases["save"].cpu_total - est.phases["step"].cpu_total
    assert host == est.details["save_gathered_model"]
