"""AutoEP in the default search space and the exports: offered only for transformers MoE models on 2 ranks or more,
with degrees that divide the experts and the ranks; a degree above 1 switches AutoEP on; ``best --format deepspeed``
keeps the section as measured and ``--format hf`` says what accelerate does with it."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import optuna

from tuner.space import InfeasibleConfig, default_space_path, load_space
from tuner.space.dsconfig import export_config
from tuner.workload import ClusterSpec, TrialConfig, Workload, load_builtin_model

optuna.logging.set_verbosity(optuna.logging.WARNING)
MIXTRAL = json.dumps({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2})


def workload(gpus: int = 8, hf_config: str = MIXTRAL, impl: str = "transformers") -> Workload:
    model = replace(load_builtin_model("tiny-llama"), implementation=impl, hf_config=hf_config)
    return Workload(model, ClusterSpec(gpus_per_node=gpus, gpu_memory=80 * 2**30))


def suggest(work: Workload, **pins: object):
    return load_space(default_space_path(), pins=pins).suggest(optuna.create_study().ask(), work)


def offered(work: Workload, name: str, **pins: object) -> list | None:
    trial = optuna.create_study().ask()
    with contextlib.suppress(InfeasibleConfig):
        load_space(default_space_path(), pins=pins).suggest(trial, work)
    distribution = trial.distributions.get(name)
    return list(distribution.choices) if distribution is not None else None


def test_ep_is_offered_for_moe_models_dividing_the_experts_and_the_ranks() -> None:
    assert offered(workload(8), "expert_parallel") == [1, 2, 4, 8]
    assert offered(workload(4), "expert_parallel") == [1, 2, 4]
    six = json.dumps({"model_type": "qwen2_moe", "num_experts": 6, "num_experts_per_tok": 2})
    assert offered(workload(8, six), "expert_parallel") == [1, 2]


def test_ep_is_not_offered_where_it_cannot_run() -> None:
    assert offered(workload(8, hf_config=""), "expert_parallel") is None  # dense
    assert offered(workload(1), "expert_parallel") is None  # one rank
    assert offered(workload(8, impl="builtin"), "expert_parallel") is None  # AutoEP replaces transformers' blocks


def test_a_degree_above_one_switches_autoep_on_and_one_writes_nothing_deepspeed_sees() -> None:
    config = suggest(workload(8), stage=2, expert_parallel=4).trial.ds_config
    assert config["expert_parallel"] == {"autoep_size": 4, "enabled": True}
    off = suggest(workload(8), stage=2, expert_parallel=1).trial
    assert off.layout.expert_parallel == 1 and "expert_parallel" not in off.deepspeed_config()


def test_exports_carry_the_section_and_say_what_accelerate_does() -> None:
    trial = TrialConfig({"zero_optimization": {"stage": 2}, "expert_parallel": {"enabled": True, "autoep_size": 2}})
    config, notes = export_config(trial, "deepspeed")
    assert config["expert_parallel"] == {"enabled": True, "autoep_size": 2}
    assert any(note.startswith("AutoEP 2: ") and "deepspeed.initialize" in note for note in notes)
    hf, hf_notes = export_config(trial, "hf")
    assert hf["expert_parallel"] == {"enabled": True, "autoep_size": 2}
    (note,) = [note for note in hf_notes if note.startswith("AutoEP")]
    assert "accelerate" in note and "no expert-parallel setting" in note and "registry_shim" in note
