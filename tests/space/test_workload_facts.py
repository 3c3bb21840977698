"""Spaces that condition on the workload: ``when`` clauses about the trainable parameters (LoRA, frozen layers)."""

from __future__ import annotations

import contextlib
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.space import SpaceError, load_space
from tuner.space.facts import workload_facts
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model, model_from_param_count

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

STAGE = "stage: {kind: categorical, choices: [0, 1, 2, 3], key: zero_optimization.stage, default: 0}"
OFFLOAD = (
    "offload: {kind: categorical, choices: [none, cpu], key: zero_optimization.offload_optimizer.device, "
    "default: none, when: WHEN}"
)


def space_with(tmp_path: Path, when: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(f"version: 1\nparameters:\n  {STAGE}\n  {OFFLOAD.replace('WHEN', when)}\n")
    return path


def offloads(path: Path, workload: Workload) -> bool:
    """Whether the space writes an optimizer offload section for ``workload`` at ZeRO-2 (searching it)."""
    space = load_space(path, pins={"stage": 2})
    config = space.suggest(optuna.create_study().ask(), workload).trial.ds_config
    return "offload_optimizer" in config["zero_optimization"]


def test_optimizer_state_size_decides_whether_offload_is_searched(tmp_path) -> None:
    path = space_with(tmp_path, '["stage >= 1", "optimizer_state_bytes >= 64MiB"]')
    small, large = Workload(model_from_param_count(1e6)), Workload(model_from_param_count(1e8))
    assert workload_facts(small)["optimizer_state_bytes"] == 12_000_000
    assert not offloads(path, small)  # 12 MB of Adam states: not worth a run
    assert offloads(path, large)  # 1.2 GB
    # alternatives: full fine-tuning (nothing frozen) searches offload whatever its size
    either = space_with(tmp_path, '["stage >= 1", "frozen_params == 0 or optimizer_state_bytes >= 64MiB"]')
    assert offloads(either, small)
    assert load_space(either).parameter("offload").when_text == (
        "stage >= 1 and (frozen_params == 0 or optimizer_state_bytes >= 67108864)"
    )


def test_a_pin_overrides_the_spaces_condition_on_the_workload(tmp_path) -> None:
    """The space's ``when`` on the workload says where a search offers a value; a pin asks for it: the pinned offload
    is written although 12 MB of Adam states is under the space's 1 GiB (a condition on another parameter still
    holds: pinned off it, the trial is infeasible, naming the value that rules it out)."""
    from tuner.space import InfeasibleConfig

    path = space_with(tmp_path, '["stage >= 1", "optimizer_state_bytes >= 1GiB"]')
    small = Workload(model_from_param_count(1e6), ClusterSpec())
    space = load_space(path, pins={"stage": 2, "offload": "cpu"})
    config = space.suggest(optuna.create_study().ask(), small).trial.ds_config
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    unpinned = load_space(path, pins={"stage": 2})  # searched: not offered at this size
    assert "offload_optimizer" not in unpinned.suggest(optuna.create_study().ask(), small).trial.ds_config.get(
        "zero_optimization", {}
    )
    with pytest.raises(
        InfeasibleConfig, match=r"offload is pinned to .cpu., which applies only when stage >= 1 \(stage = 0\)$"
    ):
        load_space(path, pins={"stage": 0, "offload": "cpu"}).suggest(optuna.create_study().ask(), small)


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ("optimizer_state_bytes >= lots", "optimizer_state_bytes >= lots"),
        ("trainable_params >= 1MiB", "trainable_params is a number"),
        ("stage >= 1 and frozen_params == 0 or stage == 3", "mixes and with or"),
        ("trainable_params in 3", "needs a list"),
        (
            "frozen == 0",
            "workload facts (trainable_params, frozen_params, optimizer_state_bytes, seq_len, world_size, "
            "attention_heads, transformers_model, gpus_per_node, nodes, moe_model, cpu_ranks)",
        ),
    ],
)
def test_bad_fact_conditions_are_named(tmp_path, when: str, message: str) -> None:
    with pytest.raises(SpaceError, match=r"parameters\.offload\.when") as raised:
        load_space(space_with(tmp_path, f'"{when}"'))
    assert message in str(raised.value)


def test_a_parameter_may_not_take_a_fact_name(tmp_path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            version: 1
            parameters:
              frozen_params: {kind: categorical, choices: [0, 1], key: zero_optimization.stage, default: 0}
            """
        )
    )
    with pytest.raises(SpaceError, match=r"parameters\.frozen_params: frozen_params is a workload fact"):
        load_space(path)


def test_the_default_space_leaves_offload_out_for_a_small_lora_and_keeps_it_for_full_fine_tuning() -> None:
    pytest.importorskip("peft")
    from tuner.profile import model_from_config, with_profile
    from tuner.space import default_space_path
    from tuner.workload import TrainableSpec, TrainSpec, preset_config

    model = model_from_config(preset_config("tiny-llama"), "tiny-llama")
    full = Workload(model, ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=64))
    adapter = {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}
    lora = with_profile(Workload(model, full.cluster, full.train, trainable=TrainableSpec.of(adapter)))
    facts = workload_facts(lora)
    assert facts["trainable_params"] == 14_336 and facts["optimizer_state_bytes"] == 12 * 14_336
    assert facts["frozen_params"] == model.n_params  # the base; the adapter trains
    assert offloads(default_space_path(), full)
    assert not offloads(default_space_path(), lora)  # 168 KiB of Adam states


def test_long_context_is_offered_only_where_measured_runs_can_train_it() -> None:
    """At 8,192 tokens on 2 ranks the default space offers Ulysses and ALST's tiling for the transformers model, and
    not for the built-in one (its runs refuse them); checkpoint offload on CUDA ranks only (on CPU ranks it cannot
    be measured: its pinned host copy needs CUDA)."""
    from tuner.space import InfeasibleConfig, default_space_path

    space = load_space(default_space_path())
    offered = {}
    for impl, device in (("transformers", "cpu"), ("builtin", "cpu"), ("transformers", "cuda")):
        model = replace(load_builtin_model("tiny-llama"), implementation=impl)
        work = Workload(model, ClusterSpec(gpus_per_node=2, device=device), TrainSpec(8192))
        keys: set[str] = set()
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
        for _ in range(40):
            trial = study.ask()
            with contextlib.suppress(InfeasibleConfig):
                space.suggest(trial, work)
            keys |= set(trial.params)
        offered[impl, device] = keys
    assert {"sequence_parallel", "tiled_mlp_shards"} <= offered["transformers", "cpu"]
    assert not {"sequence_parallel", "tiled_mlp_shards", "tiled_loss_shards"} & offered["builtin", "cpu"]
    assert "offload_checkpoints" in offered["transformers", "cuda"]
    assert "offload_checkpoints" not in offered["transformers", "cpu"]
