"""AutoTP and ZeRO++ hpZ in the default search space: offered only where DeepSpeed can run them and they mean
something, the batch arithmetic over the data-parallel ranks, and invalid combinations pruned naming the field."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import optuna
import pytest

from tuner.space import InfeasibleConfig, default_space_path, load_space
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = load_space(default_space_path())


def workload(preset: str, gpus: int = 8, nodes: int = 1, impl: str = "transformers", hf_config: str = "") -> Workload:
    model = replace(load_builtin_model(preset), implementation=impl, hf_config=hf_config)
    return Workload(model, ClusterSpec(gpus_per_node=gpus, nodes=nodes, gpu_memory=80 * 2**30))


def offered(work: Workload, name: str, **pins: object) -> list | None:
    """The choices a trial is offered for ``name`` (None: not asked)."""
    trial = optuna.create_study().ask()
    with contextlib.suppress(InfeasibleConfig):  # the choices were offered before any pruning
        load_space(default_space_path(), pins=pins).suggest(trial, work)
    distribution = trial.distributions.get(name)
    return list(distribution.choices) if distribution is not None else None


def test_a_70b_study_on_two_nodes_proposes_tp_and_hpz_with_the_data_parallel_batch() -> None:
    work = workload("llama-3.1-70b", nodes=2)  # 64 heads, 8 key-value heads, 16 GPUs
    assert offered(work, "tensor_parallel") == [1, 2, 4, 8]
    assert offered(work, "hpz_partition_size", stage=3) == [1, 2, 4, 8]
    assert offered(work, "hpz_partition_size", stage=2) is None  # hpZ is a ZeRO-3 feature
    pins = {"stage": 3, "tensor_parallel": 4, "hpz_partition_size": 1, "micro_batch": 2}
    suggestion = load_space(default_space_path(), pins=pins).suggest(optuna.create_study().ask(), work, global_batch=64)
    config = suggestion.trial.ds_config
    assert config["tensor_parallel"] == {"autotp_size": 4}
    # 16 ranks / tp 4 = 4 data-parallel ranks: 2 × 8 × 4 = 64
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (2, 8)
    assert config["train_batch_size"] == 64


@pytest.mark.parametrize(
    ("work", "why"),
    [
        (workload("llama-3.1-70b", gpus=1, nodes=4), "one GPU per node"),
        (workload("tiny-llama", gpus=2), "a tiny model: ZeRO fits it"),
        (workload("llama-3.1-70b", hf_config='{"num_local_experts": 8}'), "MoE: AutoTP leaves its experts whole"),
        (workload("llama-3.1-70b", impl="builtin"), "the built-in model has no tp_plan"),
    ],
)
def test_tp_is_not_offered_where_it_means_nothing_or_cannot_run(work: Workload, why: str) -> None:
    assert offered(work, "tensor_parallel") is None, why


def test_tp_choices_divide_the_gpus_of_a_node_and_the_key_value_heads() -> None:
    assert offered(workload("llama-3-8b", gpus=4), "tensor_parallel") == [1, 2, 4]  # 8 key-value heads
    assert offered(workload("llama-2-7b", gpus=8), "tensor_parallel") == [1, 2, 4, 8]  # 32 heads, 32 key-value heads


def test_hpz_needs_nodes_and_its_groups_stay_within_one() -> None:
    assert offered(workload("tiny-llama", gpus=2), "hpz_partition_size", stage=3) is None  # one node
    assert offered(workload("tiny-llama", gpus=2, nodes=2), "hpz_partition_size", stage=3) == [1, 2]


def test_tp_with_ulysses_is_pruned_naming_the_field() -> None:
    work = replace(workload("llama-3.1-70b", nodes=2), train=TrainSpec(seq_len=8192))
    space = load_space(default_space_path(), pins={"sequence_parallel": 2, "tensor_parallel": 2})
    with pytest.raises(InfeasibleConfig, match=r"tensor_parallel\.autotp_size: AutoTP with Ulysses"):
        space.suggest(optuna.create_study().ask(), work)


def test_hpz_with_tp_is_pruned_naming_the_field() -> None:
    """DeepSpeed 0.19.8 makes hpZ groups of consecutive ranks: under AutoTP one tensor-parallel group."""
    space = load_space(default_space_path(), pins={"stage": 3, "tensor_parallel": 2, "hpz_partition_size": 2})
    with pytest.raises(InfeasibleConfig, match=r"zero_optimization\.zero_hpz_partition_size: hpZ with AutoTP"):
        space.suggest(optuna.create_study().ask(), workload("llama-3.1-70b", nodes=2))
    hpz = load_space(default_space_path(), pins={"stage": 3, "tensor_parallel": 1, "hpz_partition_size": 8})
    config = hpz.suggest(optuna.create_study().ask(), workload("llama-3.1-70b", nodes=2)).trial.ds_config
    assert config["zero_optimization"]["zero_hpz_partition_size"] == 8


def test_a_pinned_tp_overrides_the_spaces_size_condition_and_offers_the_dp_share_of_micro_batches() -> None:
    """The default space offers AutoTP from 1e9 trainable parameters; pinned on the tiny model it applies anyway
    (the pin asks for it), and under tp 2 on 2 ranks (one data-parallel rank) a global batch of 8 offers micro-batch
    8: a config queued with it (an earlier study's best, warm-started) is proposed, not a ValueError from Optuna."""
    work = workload("tiny-llama", gpus=2)
    space = load_space(default_space_path(), pins={"tensor_parallel": 2})
    study = optuna.create_study()
    study.enqueue_trial({"stage": 0, "micro_batch": 8})
    config = space.suggest(study.ask(), work, global_batch=8).trial.ds_config
    assert config["tensor_parallel"] == {"autotp_size": 2}
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (8, 1)
    trial = optuna.create_study().ask()
    space.suggest(trial, work, global_batch=8)
    assert list(trial.distributions["micro_batch"].choices) == [1, 2, 4, 8]


def test_a_queued_value_the_study_does_not_offer_is_pruned_with_its_reason() -> None:
    """Searched tp: the micro-batches offered divide global / world (one set for the study); a queued micro-batch 8
    is pruned naming it, never a ValueError that leaves Optuna's trial running."""
    from tuner.forecast.warm_start import _Fixed

    work = workload("tiny-llama", gpus=2)
    study = optuna.create_study()
    study.enqueue_trial({"stage": 0, "micro_batch": 8})
    with pytest.raises(InfeasibleConfig, match=r"micro_batch: the queued value is not offered here \('8' not in"):
        SPACE.suggest(study.ask(), work, global_batch=8)
    with pytest.raises(InfeasibleConfig, match="micro_batch 8 is not among the choices"):  # the warm start's check
        SPACE.suggest(_Fixed({"micro_batch": 8}, {p.name: p.searchable_default() for p in SPACE.parameters}), work, 8)
