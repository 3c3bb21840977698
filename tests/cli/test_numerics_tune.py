"""``dstune tune --allow-numerics-changes`` end to end on CPU (real DeepSpeed, one measured run): a memory-bound
workload no config of the default space fits, which fits with bf16 master weights and optimizer states, and
``dstune best`` says that its config changes the numerics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from tuner.storage import Store

pytestmark = pytest.mark.deepspeed
DSTUNE = str(Path(sys.executable).with_name("dstune"))
# 29.5M parameters at ZeRO-1 on one rank, without offload: fp32-master Adam needs about 507 MiB by the estimator,
# bf16 master weights and optimizer states about 338 MiB (tests/space/test_numerics_choices.py)
MODEL = {"model_type": "gpt2", "vocab_size": 8192, "n_positions": 128, "n_embd": 512, "n_layer": 8, "n_head": 8}
PINS = ["stage=1", "offload_optimizer=none", "reduce_bucket_size=10000000", "allgather_bucket_size=10000000"]


def dstune(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([DSTUNE, *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_a_memory_bound_study_fits_only_with_bf16_master_weights(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MODEL))
    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    workload = ["--model", str(config), "--gpus", "1", "--seq-len", "64", "--device", "cpu", "--gpu-memory", "400MiB"]
    pins = [arg for pin in PINS for arg in ("--pin", pin)]
    common = [*workload, *pins, "--global-batch", "1", "--warmup", "1", "--steps", "1", "--launcher", "local"]
    dstune("tune", *common, "--storage", storage, "--study", "plain", "--trials", "3", code=1)  # nothing measured
    dstune("tune", *common, "--storage", storage, "--study", "bf16", "--trials", "1", "--allow-numerics-changes")

    with Store.open(storage) as store:
        plain, bf16 = store.get_study("plain"), store.get_study("bf16")
        assert plain is not None and bf16 is not None
        assert [t.status for t in store.trials(plain.id)] == ["pruned"] * 3  # fp32 master: nothing fits
        assert bf16.settings["allow_numerics_changes"] is True and not plain.settings["allow_numerics_changes"]
        (trial,) = store.trials(bf16.id)
        assert trial.status == "ok", trial.error
        assert trial.trial.numerics.bf16_master and trial.measurement is not None
        assert 0 < max(trial.measurement["peak_bytes_per_rank"]) <= 400 * 2**20  # it did fit, measured
    best = dstune("best", "--study", "bf16", "--storage", storage, "--out", str(tmp_path / "best.json"))
    said = best.stdout + best.stderr
    assert "changes the numerics" in said and "bf16 master weights and gradients" in said, said
    exported = json.loads((tmp_path / "best.json").read_text())
    assert exported["bf16"]["bf16_master_weights_and_grads"] is True
