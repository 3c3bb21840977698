"""``dstune best`` exports of a sequence-parallel trial: the ds_config keeps ``sequence_parallel_size``; the notes
say what the training code adds (DeepSpeed: the Ulysses calls; HF: accelerate's ParallelismConfig)."""

from __future__ import annotations

import pytest

from tuner.space.dsconfig import export_config
from tuner.workload import TrialConfig

TRIAL = TrialConfig(
    {
        "train_micro_batch_size_per_gpu": 1,
        "sequence_parallel_size": 2,
        "zero_optimization": {"stage": 2},
        "dstune": {"tiled_mlp_shards": 4, "tiled_loss_shards": 8},
    }
)


def test_deepspeed_export_keeps_sequence_parallel_size_and_names_the_ulysses_calls() -> None:
    config, notes = export_config(TRIAL, "deepspeed", "sdpa", None, 4096)
    assert config["sequence_parallel_size"] == 2 and "dstune" not in config
    text = "\n".join(notes)
    for call in ("register_with_transformers", "mpu=mpu", "UlyssesSPDataLoaderAdapter", "TiledMLP", "TiledFusedLogits"):
        assert call in text
    assert "seq_length=4096" in text and "own share" in text  # ZeRO-2: no all_gather of the shares


def test_hf_export_prints_a_parallelism_config_the_installed_accelerate_builds() -> None:
    accelerate = pytest.importorskip("accelerate")
    config, notes = export_config(TRIAL, "hf", "sdpa", None, 4096)
    assert config["sequence_parallel_size"] == 2 and config["train_micro_batch_size_per_gpu"] == "auto"
    snippet = next(note for note in notes if note.startswith("# Ulysses"))
    scope: dict = {"WORLD_SIZE": 4}
    exec(snippet[: snippet.index("model = ")], scope)
    parallelism = scope["parallelism"]
    assert (parallelism.sp_size, parallelism.sp_backend, parallelism.dp_shard_size) == (2, "deepspeed", 2)
    assert parallelism.sp_handler.sp_seq_length == 4096 and parallelism.sp_handler.sp_attn_implementation == "sdpa"
    assert accelerate.__version__
    assert "gives 2x the gradient" in snippet  # ZeRO-2 under the Trainer's loss reduction (measured)
