"""``dstune best`` exports of AutoTP and ZeRO++ hpZ trials: the ds_config keeps ``tensor_parallel`` and the hpZ key,
leaves the global batch to DeepSpeed under AutoTP (its check counts every rank), passes DeepSpeed's own validation at
the ranks it counts, and the notes say what the training code (or the HF Trainer's accelerate) must do."""

from __future__ import annotations

import pytest

from tuner.space.dsconfig import export_config, validate_with_deepspeed
from tuner.workload import TrialConfig

TRIAL = TrialConfig(
    {
        "train_batch_size": 16,  # micro 2 × accumulation 4 × dp 2 (8 ranks / tp 4)
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True},
        "tensor_parallel": {"autotp_size": 4},
        "zero_optimization": {"stage": 3},
    }
)
HPZ = TrialConfig(
    {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}}
)


def test_deepspeed_export_keeps_tp_and_hpz_and_leaves_the_global_batch_to_deepspeed() -> None:
    config, notes = export_config(TRIAL, "deepspeed")
    assert config["tensor_parallel"] == {"autotp_size": 4}
    assert "train_batch_size" not in config
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (2, 4)
    pytest.importorskip("deepspeed")
    validate_with_deepspeed(config, TRIAL.deepspeed_world(8))  # DeepSpeed's own classes accept it on 8 ranks
    (autotp,) = [note for note in notes if note.startswith("AutoTP 4")]
    assert "deepspeed.initialize" in autotp and "rank // 4" in autotp
    config, notes = export_config(HPZ, "deepspeed")
    assert config["zero_optimization"]["zero_hpz_partition_size"] == 2
    assert [note for note in notes if note.startswith("ZeRO++ hpZ 2")]


def test_hf_export_keeps_autotp_in_the_ds_config_and_says_parallelism_config_is_not_it() -> None:
    config, notes = export_config(TRIAL, "hf")
    assert config["tensor_parallel"] == {"autotp_size": 4} and config["train_micro_batch_size_per_gpu"] == "auto"
    (autotp,) = [note for note in notes if note.startswith("AutoTP 4")]
    assert "ParallelismConfig tp_size at 1" in autotp and "\n" not in autotp


def test_the_stored_dp_batch_of_a_tp_trial_is_what_deepspeed_would_refuse() -> None:
    """Why the export leaves it out: DeepSpeed 0.19.8 counts all 8 ranks, the trial's 16 samples count dp = 2."""
    pytest.importorskip("deepspeed")
    from tuner.workload import ConfigError

    with pytest.raises(ConfigError, match="16 != 2 \\* 4 \\* 8"):
        validate_with_deepspeed(TrialConfig.of(TRIAL).ds_config, 8)
