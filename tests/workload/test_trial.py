"""TrialConfig, the one reader of a ds_config: typed sections with DeepSpeed 0.19's defaults and refusals, the batch
arithmetic over the layout's data-parallel ranks, and the summary tables show."""

from __future__ import annotations

import pytest

from tuner.estimator import resolve
from tuner.requests import TrialRequest, WorkloadInput, WorkloadRequest
from tuner.workload import (
    ClusterSpec,
    ConfigError,
    ParallelLayout,
    TrialConfig,
    Workload,
    ZeroConfig,
    model_from_param_count,
)


def test_defaults_are_deepspeeds() -> None:
    trial = TrialConfig({})
    assert trial.stage == 0 and trial.precision == "fp32"
    assert trial.zero == ZeroConfig()
    assert trial.zero.reduce_bucket_size == 500_000_000 and trial.zero.offload_param.buffer_count == 5
    assert trial.layout == ParallelLayout() and trial.batch_sizes(8) == (1, 1, 8)
    assert TrialConfig({"zero_optimization": {"stage": 3}}).zero.overlap_comm  # on by default at stage 3 only
    assert TrialConfig({"bfloat16": {"enabled": True}}).precision == "bf16"  # DeepSpeed's old spelling


ZERO = "zero_optimization."


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
        ({"zero_optimization": {"stage": 1, "reduce_bucket_sise": 1}}, "zero_optimization.reduce_bucket_sise"),
        (
            {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
            "zero_optimization.offload_optimizer.device",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            "zero_optimization.offload_param.nvme_path",
        ),
        ({"zero_optimization": {"stage": 2, "allgather_bucket_size": 3}}, "zero_optimization.allgather_bucket_size"),
        ({"zero_optimization": "3"}, "zero_optimization"),
    ],
)
def test_a_bad_zero_section_is_refused_naming_the_key(config: dict, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        _ = TrialConfig(config).zero
    assert error.value.field == field


def test_the_global_batch_counts_data_parallel_ranks_only() -> None:
    ulysses = TrialConfig({"sequence_parallel_size": 2, "train_micro_batch_size_per_gpu": 2})
    assert ulysses.layout.data_parallel(8) == 4 and ulysses.global_batch(8) == 8  # 2 × 1 × (8 / sp 2)
    assert ulysses.with_batch(2, 3, 8).ds_config["train_batch_size"] == 24
    tensor = TrialConfig({"tensor_parallel": {"autotp_size": 4}, "train_batch_size": 16})
    assert tensor.batch_sizes(8) == (8, 1, 16)  # 16 samples over 2 data-parallel ranks
    with pytest.raises(ConfigError, match="must divide the 6 ranks"):
        TrialConfig({"sequence_parallel_size": 4}).global_batch(6)
    with pytest.raises(ConfigError) as error:
        TrialConfig({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2}).batch_sizes(4)
    assert error.value.field == "train_batch_size"


def test_the_estimator_reads_the_trial_and_refuses_what_it_does_not_model() -> None:
    workload = Workload(model_from_param_count(1e9), ClusterSpec(gpus_per_node=8))
    settings = resolve(workload, TrialConfig({"sequence_parallel_size": 2, "train_micro_batch_size_per_gpu": 2}))
    assert (settings.micro_batch, settings.grad_accum, settings.global_batch, settings.layout.sequence_parallel) == (
        2,
        1,
        8,
        2,
    )
    with pytest.raises(ConfigError) as error:
        resolve(workload, {"tensor_parallel": {"autotp_size": 2}})
    assert error.value.field == "tensor_parallel.autotp_size"


def test_summary_is_lenient_and_names_what_matters() -> None:
    trial = TrialConfig(
        {
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
            "sequence_parallel_size": 2,
        },
        activation_checkpointing=True,
    )
    assert trial.summary() == "ZeRO-3 · micro 4 × accum 2 · bf16 · params → cpu · SP 2 · checkpointing"
    assert TrialConfig({}).summary() == "(no ds_config)"
    assert TrialConfig({"sequence_parallel_size": "x"}).summary() == "ZeRO-0"  # stored or refused configs too


def test_trial_request_makes_the_trial_config_and_the_api_object_splits_in_two() -> None:
    trial = TrialRequest(micro_batch=2, grad_accum=4, stage=2, ds_config={"zero_optimization": {"stage": 3}})
    config = trial.to_trial("bf16")
    assert (config.stage, config.batch, config.precision) == (3, (2, 4), "bf16")  # ds_config wins
    sent = WorkloadInput(model="tiny-gpt2", micro_batch=8, activation_checkpointing=True)
    assert sent.trial_fields() == {"micro_batch": 8, "grad_accum": 1, "activation_checkpointing": True}
    assert WorkloadInput.model_validate(WorkloadRequest(model="tiny-gpt2", gpus=2)).gpus == 2
    with pytest.raises(ValueError, match="micro_batch"):
        WorkloadRequest(model="tiny-gpt2", micro_batch=2)  # the workload alone has no trial fields


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "4"])
def test_threads_per_rank_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(ConfigError) as error:
        _ = TrialConfig({"dstune": {"threads_per_rank": value}}).threads_per_rank
    assert error.value.field == "dstune.threads_per_rank"


def test_threads_per_rank_stay_out_of_what_deepspeed_gets() -> None:
    trial = TrialConfig({"train_micro_batch_size_per_gpu": 1, "dstune": {"threads_per_rank": 4}})
    assert trial.threads_per_rank == 4 and "dstune" not in trial.deepspeed_config()
    assert TrialConfig({}).threads_per_rank is None
