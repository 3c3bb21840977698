"""LoRA end to end on CPU ranks: ``dstune measure --peft`` and ``dstune tune --peft`` run real peft under real
DeepSpeed, and the HF Trainer trains on what ``dstune best --format hf`` exports, as is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_launch import train_on_two_cpu_ranks

pytest.importorskip("deepspeed")
pytest.importorskip("peft")

from tuner.storage import Store

pytestmark = pytest.mark.deepspeed
DSTUNE = str(Path(sys.executable).with_name("dstune"))
PRESETS = Path(__file__).resolve().parents[2] / "tuner" / "workload" / "presets"
ADAPTER = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
# tiny-llama: hidden 128, 4 query heads and 2 key/value heads of 32, 4 layers. LoRA adds r·(in + out) per adapted
# projection: q_proj 8·(128 + 128) = 2,048, v_proj 8·(128 + 64) = 1,536, so 3,584 a layer.
TINY_LLAMA_LORA_PARAMS = 4 * (8 * (128 + 128) + 8 * (128 + 64))
WORKLOAD = ["--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--seq-len", "32"]


def dstune(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([DSTUNE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(ADAPTER))
    return path


def test_measure_peft_trains_only_the_adapter_under_zero3(adapter: Path) -> None:
    done = dstune(
        "measure", *WORKLOAD, "--peft", str(adapter), "--stage", "3", "--micro-batch", "1",
        "--warmup", "1", "--steps", "1", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["tokens_per_s"] > 0
    # each rank counted the parameters it handed DeepSpeed (ZeRO-3 partitions the adapter at initialize)
    assert [rank["trainable_params"] for rank in result["ranks"]] == [TINY_LLAMA_LORA_PARAMS] * 2


def test_tune_peft_records_results_and_the_hf_trainer_trains_on_the_export(tmp_path: Path, adapter: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'peft.db'}"
    done = dstune(
        "tune", *WORKLOAD, "--peft", str(adapter), "--trials", "2", "--global-batch", "4", "--pin", "stage=2",
        "--warmup", "1", "--steps", "1", "--seed", "1", "--storage", storage, "--study", "lora",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with Store.open(storage) as store:
        record = store.get_study("lora")
        assert record is not None
        trials = store.trials(record.id)
        assert store.workload_of(record.id).trainable.peft_config == ADAPTER
    assert [t.status for t in trials].count("ok") >= 1, [(t.status, t.error) for t in trials]

    exported = dstune("best", "--study", "lora", "--storage", storage, "--format", "hf")
    assert exported.returncode == 0, exported.stderr
    (tmp_path / "ds.json").write_text(exported.stdout)
    (tmp_path / "notes.txt").write_text(exported.stderr)
    assert '"task_type": "CAUSAL_LM"' in exported.stderr and '"target_modules": ["q_proj", "v_proj"]' in exported.stderr

    out = tmp_path / "trained.json"
    train_on_two_cpu_ranks(Path(__file__).with_name("hf_trainer_peft.py"), tmp_path, PRESETS / "tiny-llama.json", out)
    result = json.loads(out.read_text())
    assert result["steps"] == 3 and len(result["losses"]) == 3
    assert all(0 < loss < 100 for loss in result["losses"])  # finite
    assert result["trainable"] and all(".lora_" in name for name in result["trainable"])
    assert result["changed"] == result["trainable"]  # every adapter weight moved, no base weight did
    assert result["params"] > len(result["trainable"])
