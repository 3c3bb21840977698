"""A study pinned to each layout kind (Ulysses, AutoTP, AutoEP, hpZ) offers its trials, its grid and its warm start
the same micro-batches, all from the data-parallel ranks of the pinned layout (:class:`tuner.workload.Ranks`): under
tp 2 or sp 2 on 2 ranks a global batch of 8 is one data-parallel rank's, so micro-batch 8 (accumulation 1) is offered
everywhere, and what the warm start queues is always a value the study offers."""

from __future__ import annotations

import json
from dataclasses import replace

import optuna
import pytest
from tiny_configs import TINY_CONFIGS

from tuner.forecast import Calibration, ThroughputGuide
from tuner.space import default_space_path, load_space
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model
from tuner.workload.layouts import LAYOUTS

optuna.logging.set_verbosity(optuna.logging.WARNING)
MOE = {**TINY_CONFIGS["qwen2_moe"], "num_hidden_layers": 2, "mlp_only_layers": [], "tie_word_embeddings": False}


def workload(moe: bool = False, nodes: int = 1) -> Workload:
    """The transformers tiny LLaMA (or a tiny Qwen2-MoE) on 2 CPU ranks a node, 64 GiB each: everything fits."""
    model = replace(load_builtin_model("tiny-llama"), implementation="transformers")
    if moe:
        model = replace(model, hf_config=json.dumps(MOE))
    cluster = ClusterSpec(gpus_per_node=2, nodes=nodes, gpu_memory=64 * 2**30, device="cpu")
    return Workload(model, cluster, TrainSpec(seq_len=64))


# each layout pinned at 2 on a workload that can run it, with the micro-batches a global batch of 8 leaves
PINNED = {
    "sequence_parallel": ({}, workload(), [1, 2, 4, 8]),  # 2 ranks / sp 2: one data-parallel rank
    "tensor_parallel": ({}, workload(), [1, 2, 4, 8]),
    "expert_parallel": ({}, workload(moe=True), [1, 2, 4]),  # experts split, not the batch: 2 data-parallel ranks
    "hpz_partition_size": ({"stage": 3}, workload(nodes=2), [1, 2]),  # 4 data-parallel ranks
}


def test_every_layout_kind_is_covered() -> None:
    assert set(PINNED) == {kind.field for kind in LAYOUTS}


@pytest.mark.parametrize("field", list(PINNED))
def test_a_pinned_layouts_trials_grid_and_warm_start_offer_the_same_micro_batches(field: str) -> None:
    extra, work, micro = PINNED[field]
    space = load_space(default_space_path(), pins={field: 2, **extra})
    trial = optuna.create_study().ask()
    suggestion = space.suggest(trial, work, global_batch=8)
    assert suggestion.trial.layout.degree(next(k for k in LAYOUTS if k.field == field)) == 2
    assert list(trial.distributions["micro_batch"].choices) == micro
    assert space.grid(["micro_batch"], global_batch=8, world_size=work.cluster.world_size) == {"micro_batch": micro}
    guide = ThroughputGuide(space, work, Calibration(), global_batch=8)
    queued = guide.warm_start(8)
    assert queued and {params["micro_batch"] for params in queued} <= set(micro)
    study = optuna.create_study()  # each queued config is one the study's trials take as is
    for params in queued:
        study.enqueue_trial(params)
        space.suggest(study.ask(), work, global_batch=8)


def test_the_warm_start_under_tp_2_ranks_micro_batch_8() -> None:
    """tp 2 on 2 ranks: the one data-parallel rank takes the whole global batch of 8 in one micro-batch; the warm
    start ranks that config among its candidates (it ranked only micro-batches up to 4, global / world)."""
    space = load_space(default_space_path(), pins={"tensor_parallel": 2})
    guide = ThroughputGuide(space, workload(), Calibration(), global_batch=8)
    assert 8 in {params["micro_batch"] for params in guide.warm_start(64)}
