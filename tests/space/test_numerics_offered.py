"""Muon and the chunked loss are offered wherever their layout clauses hold: a layout parameter that cannot apply to
the workload (AutoTP below 1e9 parameters, Ulysses and the tiled loss below 4,096 tokens, AutoEP without experts)
stays at 1, so its clause holds; kept as a clause it never held (an inactive parameter satisfies no clause) and the
choices were never offered to such workloads, the memory-bound 1-GPU study of the issue among them."""

from __future__ import annotations

from dataclasses import replace

import optuna

from tests.space.test_numerics_choices import DEFAULT, PINS, TINY, memory_bound
from tuner.space.numerics_choices import load_study_space
from tuner.workload import ClusterSpec, TrainSpec, Workload, model_from_param_count, preset_config
from tuner.workload.hf_config import model_from_hf_config

optuna.logging.set_verbosity(optuna.logging.WARNING)


def offered_labels(workload: Workload, pins: dict, global_batch: int, tries: int = 40) -> set[str]:
    """Every numerics label of the configs a random search of the study's space suggests."""
    space = load_study_space(DEFAULT, pins, workload, allowed=True)
    seen: set[str] = set()
    for seed in range(tries):
        trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed)).ask()
        try:
            suggestion = space.suggest(trial, workload, global_batch=global_batch)
        except Exception:  # pruned by the space: another seed
            continue
        seen.update(suggestion.trial.numerics.labels())
    return seen


def test_a_one_gpu_short_sequence_study_offers_muon_and_the_chunked_loss() -> None:
    pins = {name: value for name, value in PINS.items() if name != "micro_batch"}
    seen = offered_labels(memory_bound(), pins, global_batch=1)
    assert {"Muon optimizer", "chunked cross-entropy loss", "bf16 master weights and gradients"} <= seen, seen


def test_a_two_rank_study_of_a_small_model_offers_them_too() -> None:
    seen = offered_labels(TINY, {}, global_batch=8)
    assert {"Muon optimizer", "chunked cross-entropy loss"} <= seen, seen


def test_where_autotp_applies_muon_keeps_its_clause() -> None:
    """A 7B transformers model on 8 GPUs: AutoTP is searched, and Muon is offered only with it off."""
    model = replace(model_from_hf_config(preset_config("llama-2-7b"), name="llama-2-7b"), implementation="transformers")
    workload = Workload(model, ClusterSpec(gpus_per_node=8), TrainSpec(2048))
    space = load_study_space(DEFAULT, {}, workload, allowed=True)
    muon = next(parameter for parameter in space.parameters if parameter.name == "muon")
    assert "tensor_parallel == 1" in muon.when_text
    bare = Workload(model_from_param_count(7e9), ClusterSpec(gpus_per_node=8))
    assert "muon" not in load_study_space(DEFAULT, {}, bare, allowed=True).names  # no shapes: no Muon/Adam split
