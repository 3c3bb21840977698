"""Search spaces: YAML validation, Optuna studies (TPE, random, grid), DeepSpeed-valid configs, batch rule, pins."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tuner.estimator import ConfigError, resolve
from tuner.space import (
    InfeasibleConfig,
    SearchSpace,
    SpaceError,
    Suggestion,
    config_key,
    default_space_path,
    load_space,
    space_names,
)
from tuner.space.dsconfig import validate_with_deepspeed
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

STAGE3_KEYS = {
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "sub_group_size",
    "offload_param",
}


@pytest.fixture
def deepspeed_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make DeepSpeed importable without a GPU (skips when DeepSpeed is not installed)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return load_space(default_space_path())


def workload(world: tuple[int, int] = (4, 2), **train: Any) -> Workload:
    gpus, nodes = world
    return Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=gpus, nodes=nodes), TrainSpec(**train))


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def run_study(
    space: SearchSpace,
    work: Workload,
    sampler: Any,
    n_trials: int,
    global_batch: int | None = None,
    nvme_path: str | None = None,
) -> tuple[Any, list[tuple[Any, Suggestion]]]:
    """Optimise a dummy objective; InfeasibleConfig becomes a pruned trial. Returns the study and the suggestions."""
    seen: list[tuple[Any, Suggestion]] = []

    def objective(trial: Any) -> float:
        try:
            suggestion = space.suggest(trial, work, global_batch=global_batch, nvme_path=nvme_path)
        except InfeasibleConfig as error:
            trial.set_user_attr("infeasible", error.reason)
            raise optuna.TrialPruned(error.reason) from None
        seen.append((trial, suggestion))
        return float(int(suggestion.key, 16) % 1000)

    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=n_trials)
    return study, seen


def check_suggestion(trial: Any, suggestion: Suggestion, work: Workload, global_batch: int | None = None) -> None:
    """Every invariant a suggestion must hold, DeepSpeed's validation included."""
    config = suggestion.trial.ds_config
    world = work.cluster.world_size
    resolve(work, config)
    validate_with_deepspeed(config, world)
    micro, accum = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == micro * accum * world
    if global_batch is not None:
        assert config["train_batch_size"] == global_batch
    assert suggestion.params == trial.params
    zero = config["zero_optimization"]
    stage = zero["stage"]
    if stage != 3:
        assert not STAGE3_KEYS & zero.keys(), zero
    if stage == 0:
        assert set(zero) == {"stage"}, zero
    if stage not in (1, 2):
        assert "allgather_bucket_size" not in zero
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    assert config["optimizer"]["type"] == "AdamW"
    assert isinstance(suggestion.trial.activation_checkpointing, bool)


# --- the default space --------------------------------------------------------------------------------------------


def test_default_space_covers_the_zero_settings(space: SearchSpace) -> None:
    for name in (
        "stage",
        "micro_batch",
        "grad_accum",
        "activation_checkpointing",
        "overlap_comm",
        "contiguous_gradients",
        "reduce_bucket_size",
        "allgather_bucket_size",
        "offload_optimizer",
        "offload_param",
        "offload_optimizer_pin_memory",
        "offload_param_pin_memory",
        "round_robin_gradients",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "sub_group_size",
    ):
        assert name in space.names
    assert space.searched == space.names
    assert space.parameter("micro_batch").choices == (1, 2, 4, 8, 16, 32, 64)
    assert space.parameter("zero_optimization.stage").name == "stage"
    assert "precision" not in space.names


def test_default_space_defaults_match_deepspeed(deepspeed_on_cpu: None, space: SearchSpace) -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    defaults = DeepSpeedZeroConfig()
    stage_dependent = space.parameter("overlap_comm")
    assert stage_dependent.default is None  # null: DeepSpeed decides, by stage
    assert (DeepSpeedZeroConfig(stage=1).overlap_comm, DeepSpeedZeroConfig(stage=3).overlap_comm) == (False, True)
    for parameter in space.parameters:
        if parameter.default is None:
            continue
        if parameter.key and parameter.key.startswith("zero_optimization.") and parameter.key.count(".") == 1:
            field = parameter.key.split(".")[1]
            attribute = {
                "stage3_max_live_parameters": "max_live_parameters",
                "stage3_max_reuse_distance": "max_reuse_distance",
                "stage3_prefetch_bucket_size": "prefetch_bucket_size",
                "stage3_param_persistence_threshold": "param_persistence_threshold",
            }.get(field, field)
            assert parameter.default == getattr(defaults, attribute), parameter.name
    offload = {
        "offload_optimizer": DeepSpeedZeroOffloadOptimizerConfig(),
        "offload_param": DeepSpeedZeroOffloadParamConfig(),
    }
    for section, config in offload.items():
        parameter = space.parameter(f"zero_optimization.{section}.pin_memory")
        assert parameter.default is config.pin_memory is True, parameter.name


def test_default_space_by_name_and_listing() -> None:
    assert "default" in space_names()
    assert load_space("default").names == load_space(default_space_path()).names
    assert default_space_path().is_file()


def test_space_module_imports_no_heavy_dependency() -> None:
    code = (
        "import sys, tuner.space; "
        "heavy = {'torch', 'deepspeed', 'ray', 'sqlalchemy', 'optuna'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- studies: every suggestion is a valid DeepSpeed config ----------------------------------------------------------


@pytest.mark.usefixtures("deepspeed_on_cpu")
@pytest.mark.parametrize("sampler_name", ["tpe", "random"])
@pytest.mark.parametrize("global_batch", [None, 64])
def test_study_suggestions_pass_estimator_and_deepspeed(
    space: SearchSpace, sampler_name: str, global_batch: int | None
) -> None:
    work = workload()
    sampler = (
        optuna.samplers.TPESampler(seed=1, n_startup_trials=10)
        if sampler_name == "tpe"
        else optuna.samplers.RandomSampler(seed=2)
    )
    _, seen = run_study(space, work, sampler, n_trials=60, global_batch=global_batch)
    assert len(seen) == 60  # without NVMe nothing in the default space is infeasible
    stages = set()
    for trial, suggestion in seen:
        check_suggestion(trial, suggestion, work, global_batch)
        stages.add(suggestion.trial.ds_config["zero_optimization"]["stage"])
        if global_batch is not None:
            assert "grad_accum" not in suggestion.params
            assert suggestion.fixed["grad_accum"] == suggestion.trial.ds_config["gradient_accumulation_steps"]
            assert global_batch // 8 % suggestion.trial.ds_config["train_micro_batch_size_per_gpu"] == 0
        else:
            assert suggestion.params["grad_accum"] in (1, 2, 4, 8)
    assert stages == {0, 1, 2, 3}


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_conditional_parameters_appear_only_where_their_condition_holds(space: SearchSpace) -> None:
    _, seen = run_study(space, workload(), optuna.samplers.RandomSampler(seed=3), n_trials=80)
    for trial, suggestion in seen:
        stage = trial.params["stage"]
        zero = suggestion.trial.ds_config["zero_optimization"]
        stage3_params = {name for name in trial.params if name.startswith("stage3_")} | (
            {"sub_group_size", "offload_param"} & trial.params.keys()
        )
        assert bool(stage3_params) == (stage == 3), trial.params
        assert ("overlap_comm" in trial.params) == (stage >= 1)
        assert ("allgather_bucket_size" in trial.params) == (stage in (1, 2))
        if stage == 3:
            assert zero["offload_param"]["device"] == trial.params["offload_param"]
            assert zero["stage3_max_live_parameters"] == trial.params["stage3_max_live_parameters"]
            assert 10_000_000 <= zero["sub_group_size"] <= 10_000_000_000
        if stage >= 1:
            assert zero["reduce_bucket_size"] == trial.params["reduce_bucket_size"]
            assert isinstance(zero["reduce_bucket_size"], int)
            assert zero["offload_optimizer"]["device"] == trial.params["offload_optimizer"]
        check_offload_knobs(trial.params, zero)


def check_offload_knobs(params: dict[str, Any], zero: dict[str, Any]) -> None:
    """pin_memory only where its offload is on, round_robin_gradients only for ZeRO-1/2 with CPU optimizer offload."""
    stage = params["stage"]
    for section in ("offload_optimizer", "offload_param"):
        device = params.get(section)
        name = f"{section}_pin_memory"
        assert (name in params) == (device not in (None, "none")), params
        if name in params:
            assert zero[section] == {"device": device, "pin_memory": params[name]}
        elif section in zero:
            assert "pin_memory" not in zero[section]
    robin = stage in (1, 2) and params.get("offload_optimizer") == "cpu"
    assert ("round_robin_gradients" in params) == robin, params
    assert ("round_robin_gradients" in zero) == robin
    if robin:
        assert zero["round_robin_gradients"] is params["round_robin_gradients"]


@pytest.mark.usefixtures("deepspeed_on_cpu")
@pytest.mark.parametrize(
    ("pins", "knobs"),
    [
        ({"stage": 1, "offload_optimizer": "cpu"}, {"offload_optimizer_pin_memory", "round_robin_gradients"}),
        ({"stage": 2, "offload_optimizer": "cpu"}, {"offload_optimizer_pin_memory", "round_robin_gradients"}),
        ({"stage": 2, "offload_optimizer": "none"}, set()),
        (
            {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
            {"offload_optimizer_pin_memory", "offload_param_pin_memory"},
        ),
        ({"stage": 3, "offload_optimizer": "none", "offload_param": "cpu"}, {"offload_param_pin_memory"}),
    ],
)
def test_offload_knobs_are_searched_where_they_apply(space: SearchSpace, pins: dict[str, Any], knobs: set[str]) -> None:
    work = workload()
    _, seen = run_study(space.with_pins(pins), work, optuna.samplers.RandomSampler(seed=5), n_trials=12)
    values: dict[str, set[Any]] = {name: set() for name in knobs}
    for trial, suggestion in seen:
        check_suggestion(trial, suggestion, work)  # DeepSpeed's own classes accept every config
        check_offload_knobs({**pins, **trial.params}, suggestion.trial.ds_config["zero_optimization"])
        assert knobs == trial.params.keys() & {
            "offload_optimizer_pin_memory",
            "offload_param_pin_memory",
            "round_robin_gradients",
        }
        for name in knobs:
            values[name].add(trial.params[name])
    assert all(found == {False, True} for found in values.values()), values


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_nvme_is_offered_only_with_a_path(space: SearchSpace) -> None:
    trial = optuna.create_study().ask()
    space.with_pins({"stage": 3}).suggest(trial, workload())
    assert "nvme" not in trial.distributions["offload_param"].choices

    work = workload()
    study, seen = run_study(
        space.with_pins({"stage": 3}), work, optuna.samplers.RandomSampler(seed=4), 40, nvme_path="/local_nvme"
    )
    devices = set()
    for trial, suggestion in seen:
        check_suggestion(trial, suggestion, work)
        zero = suggestion.trial.ds_config["zero_optimization"]
        for section in ("offload_optimizer", "offload_param"):
            devices.add(zero[section]["device"])
            if zero[section]["device"] == "nvme":
                assert zero[section]["nvme_path"] == "/local_nvme"
            else:
                assert "nvme_path" not in zero[section]
    assert "nvme" in devices
    assert "nvme" in study.trials[0].distributions["offload_param"].choices


def test_nvme_optimizer_offload_below_stage3_is_infeasible(space: SearchSpace) -> None:
    pinned = space.with_pins({"stage": 2, "offload_optimizer": "nvme"})
    with pytest.raises(InfeasibleConfig, match="NVMe optimizer offload needs ZeRO stage 3"):
        pinned.suggest(optuna.create_study().ask(), workload(), nvme_path="/nvme")
    with pytest.raises(SpaceError, match=r"pins\.offload_optimizer: 'nvme' needs an NVMe path"):
        pinned.suggest(optuna.create_study().ask(), workload())


# --- batch sizes -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("micro", [1, 2, 4, 8, 16, 32, 64])
def test_global_batch_rule_and_infeasible_micro_batches(space: SearchSpace, micro: int) -> None:
    work = workload()  # world size 8
    global_batch = 48  # 6 samples per rank
    pinned = space.with_pins({"micro_batch": micro})
    trial = optuna.create_study().ask()
    if 6 % micro:
        with pytest.raises(InfeasibleConfig, match=rf"micro-batch {micro} × world size 8 .* global batch 48") as err:
            pinned.suggest(trial, work, global_batch=global_batch)
        assert err.value.params["micro_batch"] == micro
    else:
        config = pinned.suggest(trial, work, global_batch=global_batch).trial.ds_config
        assert config["train_micro_batch_size_per_gpu"] == micro
        assert config["gradient_accumulation_steps"] == 6 // micro
        assert micro * config["gradient_accumulation_steps"] * 8 == config["train_batch_size"] == 48


def test_global_batch_offers_only_dividing_micro_batches(space: SearchSpace) -> None:
    trial = optuna.create_study().ask()
    space.suggest(trial, workload(), global_batch=48)  # 6 samples per rank
    assert trial.distributions["micro_batch"].choices == (1, 2)
    even_only = SearchSpace(
        [replace(p, choices=(2, 4)) if p.name == "micro_batch" else p for p in space.parameters], space.base
    )
    with pytest.raises(InfeasibleConfig, match="no micro-batch choice divides global batch 3"):
        even_only.suggest(optuna.create_study().ask(), workload((1, 1)), global_batch=3)


def test_int_micro_batch_that_does_not_divide_is_infeasible(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        parameters:
          micro_batch: {kind: int, low: 1, high: 64, log: true, key: train_micro_batch_size_per_gpu, default: 1}
        """,
    )
    space = load_space(path)
    work = workload((2, 1))
    pruned = feasible = 0
    for seed in range(30):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        try:
            config = space.suggest(study.ask(), work, global_batch=32).trial.ds_config
        except InfeasibleConfig as error:
            assert "does not divide the global batch 32" in error.reason
            pruned += 1
        else:
            assert 16 % config["train_micro_batch_size_per_gpu"] == 0
            assert config["train_batch_size"] == 32
            feasible += 1
    assert pruned and feasible


def test_global_batch_must_be_a_multiple_of_world_size(space: SearchSpace) -> None:
    with pytest.raises(ConfigError, match="global_batch: 12 is not divisible by the data-parallel world size 8"):
        space.suggest(optuna.create_study().ask(), workload(), global_batch=12)
    with pytest.raises(ConfigError, match="global_batch"):
        space.suggest(optuna.create_study().ask(), workload(), global_batch=0)


def test_pinned_accumulation_must_agree_with_global_batch(space: SearchSpace) -> None:
    pinned = space.with_pins({"micro_batch": 2, "grad_accum": 4})
    suggestion = pinned.suggest(optuna.create_study().ask(), workload(), global_batch=64)
    assert suggestion.trial.ds_config["train_batch_size"] == 64
    with pytest.raises(InfeasibleConfig, match="grad_accum is pinned to 4 but the global batch 32 needs 2"):
        pinned.suggest(optuna.create_study().ask(), workload(), global_batch=32)


def test_space_without_batch_parameters_trains_micro_batch_one(tmp_path: Path) -> None:
    """The micro-batch and accumulation a space does not search are 1 (the workload has none of its own: they are
    the trial config's), accumulation derived from a fixed global batch."""
    path = write(
        tmp_path,
        "parameters:\n  stage: {kind: categorical, choices: [1, 2], key: zero_optimization.stage, default: 1}\n",
    )
    work = workload((2, 1))
    suggestion = load_space(path).suggest(optuna.create_study().ask(), work)
    config = suggestion.trial.ds_config
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (1, 1)
    assert config["train_batch_size"] == 2 and suggestion.trial.activation_checkpointing is False
    config = load_space(path).suggest(optuna.create_study().ask(), work, global_batch=18).trial.ds_config
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (1, 9)
    config = load_space(path).suggest(optuna.create_study().ask(), work, global_batch=16).trial.ds_config
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (1, 8)


# --- pins ------------------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_pins_are_honoured_and_not_suggested() -> None:
    pins = {"stage": "3", "zero_optimization.offload_param.device": "cpu", "activation_checkpointing": True}
    space = load_space(default_space_path(), pins=pins)
    assert space.pins == {"stage": 3, "offload_param": "cpu", "activation_checkpointing": True}
    assert set(space.searched).isdisjoint(space.pins)
    work = workload()
    _, seen = run_study(space, work, optuna.samplers.TPESampler(seed=5, n_startup_trials=5), n_trials=15)
    for trial, suggestion in seen:
        check_suggestion(trial, suggestion, work)
        assert not {"stage", "offload_param", "activation_checkpointing"} & trial.params.keys()
        assert suggestion.trial.ds_config["zero_optimization"]["stage"] == 3
        assert suggestion.trial.ds_config["zero_optimization"]["offload_param"]["device"] == "cpu"
        assert suggestion.trial.activation_checkpointing is True
        assert suggestion.fixed["stage"] == 3


def test_a_pin_pins_what_its_condition_needs(space: SearchSpace) -> None:
    """A study with ``--hpz 2`` searched every stage and pruned each trial that was not ZeRO-3, naming the pin: 6 of
    6 trials of a 2-node study. The pin now pins the stage its condition needs; a pin that contradicts it is refused
    up front, naming the pin."""
    assert space.with_pins({"hpz_partition_size": 2}).pins == {"hpz_partition_size": 2, "stage": 3}
    assert space.with_pins({"offload_param": "cpu"}).pins == {"offload_param": "cpu", "stage": 3}
    assert space.with_pins({"hpz_partition_size": 1}).pins == {"hpz_partition_size": 1}  # the default needs nothing
    with pytest.raises(
        SpaceError, match=r"pins.offload_param: 'cpu' applies only when stage == 3, but stage is pinned"
    ):
        space.with_pins({"stage": 1, "offload_param": "cpu"})
    config = space.with_pins({"stage": 1, "offload_param": "none"}).suggest(optuna.create_study().ask(), workload())
    assert "offload_param" not in config.trial.ds_config["zero_optimization"]


@pytest.mark.parametrize(
    ("pins", "key", "message"),
    [
        ({"stages": 3}, "pins.stages", "names no parameter or key path"),
        ({"zero_optimization.bogus": 1}, "pins.zero_optimization.bogus", "names no parameter"),
        ({"stage": 4}, "pins.stage", "4 is not a value of stage (choices: 0, 1, 2, 3)"),
        ({"stage": True}, "pins.stage", "True is not a value of stage"),
        ({"reduce_bucket_size": 10}, "pins.reduce_bucket_size", "not a value of reduce_bucket_size (int in ["),
        ({"reduce_bucket_size": 12_345_678.5}, "pins.reduce_bucket_size", "not a value"),
        ({"reduce_bucket_size": "lots"}, "pins.reduce_bucket_size", "'lots' is not a value"),
        ({"offload_optimizer": "disk"}, "pins.offload_optimizer", 'choices: "none", "cpu", "nvme"'),
        ({"stage": None}, "pins.stage", "None is not a value of stage"),
    ],
)
def test_bad_pins_raise_space_error(pins: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(SpaceError) as caught:
        load_space(default_space_path(), pins=pins)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"default.yaml: {key}: ")
    assert message in str(caught.value)


def test_pins_accept_numbers_as_strings_and_null_where_default_is_null(space: SearchSpace) -> None:
    pinned = space.with_pins({"reduce_bucket_size": "20_000_000", "overlap_comm": None, "stage": 2})
    assert pinned.pins == {"reduce_bucket_size": 20_000_000, "overlap_comm": None, "stage": 2}
    assert space.with_pins({"reduce_bucket_size": 2.0e7}).pins == {"reduce_bucket_size": 20_000_000}
    zero = pinned.suggest(optuna.create_study().ask(), workload()).trial.ds_config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 20_000_000 and "overlap_comm" not in zero


# --- grid baseline ---------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_grid_sampler_over_a_restricted_space(space: SearchSpace) -> None:
    names = ["stage", "micro_batch", "offload_optimizer"]
    restricted = space.restricted(names)
    assert restricted.searched == tuple(names)
    grid = restricted.grid(names, global_batch=64, world_size=8)
    assert grid == {"stage": [0, 1, 2, 3], "micro_batch": [1, 2, 4, 8], "offload_optimizer": ["none", "cpu"]}
    work = workload()
    study, seen = run_study(restricted, work, optuna.samplers.GridSampler(grid, seed=0), 100, global_batch=64)
    assert len(study.trials) == len(seen) == 4 * 4 * 2  # the sampler stops the study when the grid is done
    keys = set()
    for trial, suggestion in seen:
        check_suggestion(trial, suggestion, work, global_batch=64)
        assert set(trial.params) <= set(names)
        zero = suggestion.trial.ds_config["zero_optimization"]
        if zero["stage"] >= 1:  # every other parameter at its default
            assert zero["reduce_bucket_size"] == 500_000_000 and zero["contiguous_gradients"] is True
            assert "overlap_comm" not in zero  # default null: DeepSpeed decides
        if zero["stage"] == 3:
            assert zero["stage3_max_live_parameters"] == 1_000_000_000
            assert zero["offload_param"] == {"device": "none"}
        assert suggestion.trial.activation_checkpointing is False
        keys.add(suggestion.key)
    assert len(keys) == 4 + 3 * 4 * 2  # at stage 0 offload_optimizer does not apply: its two grid points coincide


def test_grid_values(space: SearchSpace, tmp_path: Path) -> None:
    assert space.grid(["reduce_bucket_size"]) == {
        "reduce_bucket_size": [10_000_000, 50_000_000, 200_000_000, 500_000_000, 1_000_000_000]
    }
    assert space.grid(["offload_param"], nvme_path="/nvme") == {"offload_param": ["none", "cpu", "nvme"]}
    assert space.with_pins({"stage": 2}).grid(["stage"]) == {"stage": [2]}
    assert set(space.grid()) == set(space.names)
    path = write(
        tmp_path,
        """
        parameters:
          a: {kind: int, low: 3, high: 100, log: true, key: a, default: 3}
          b: {kind: int, low: 0, high: 10, step: 5, key: b, default: 0}
          c: {kind: float, low: 0.1, high: 1.0, key: c, default: 1.0}
          d: {kind: float, low: 0.1, high: 1.0, key: d, default: 1.0, grid: [0.1, 0.5]}
        """,
    )
    custom = load_space(path)
    assert custom.grid(["a", "b", "d"]) == {"a": [4, 8, 16, 32, 64], "b": [0, 5, 10], "d": [0.1, 0.5]}
    with pytest.raises(SpaceError, match=r"space.yaml: parameters.c.grid: give `grid: \[...\]`"):
        custom.grid(["c"])
    with pytest.raises(SpaceError, match=r"space\.yaml: restricted: unknown parameter 'e'"):
        custom.restricted(["e"])


def test_float_and_linear_int_parameters_are_suggested(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        base:
          optimizer: {type: AdamW, params: {lr: 1.0e-4}}
        parameters:
          clip: {kind: float, low: 0.5, high: 2.0, step: 0.5, key: gradient_clipping, default: 1.0}
          lr: {kind: float, low: 1.0e-5, high: 1.0e-3, log: true, key: optimizer.params.lr, default: 1.0e-4}
          prints: {kind: int, low: 0, high: 4, step: 2, key: steps_per_print, default: 2}
        """,
    )
    space = load_space(path)
    for seed in range(10):
        trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed)).ask()
        config = space.suggest(trial, workload((1, 1))).trial.ds_config
        assert config["gradient_clipping"] in (0.5, 1.0, 1.5, 2.0)
        assert 1e-5 <= config["optimizer"]["params"]["lr"] <= 1e-3
        assert config["steps_per_print"] in (0, 2, 4)  # (hpZ was the int here: it is refused below ZeRO-3 now)


# --- precision, optimizer, helpers ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("deepspeed_on_cpu")
@pytest.mark.parametrize(("precision", "section"), [("bf16", "bf16"), ("fp16", "fp16"), ("fp32", None)])
def test_precision_comes_from_the_workload(tmp_path: Path, precision: str, section: str | None) -> None:
    path = write(
        tmp_path,
        """
        base:
          optimizer: {params: {lr: 1.0e-4}}
          fp16: {loss_scale_window: 500}
          bf16: {}
        parameters:
          stage: {kind: categorical, choices: [0, 3], key: zero_optimization.stage, default: 0}
        """,
    )
    work = workload((2, 1), precision=precision, optimizer="adam")
    suggestion = load_space(path).suggest(optuna.create_study().ask(), work)
    config = suggestion.trial.ds_config
    assert {"bf16", "fp16"} & config.keys() == ({section} if section else set())
    if section == "fp16":
        assert config["fp16"] == {"loss_scale_window": 500, "enabled": True}
    assert config["optimizer"]["type"] == "Adam"
    validate_with_deepspeed(config, 2)
    assert resolve(work, config).precision == precision


def test_suggestion_is_one_trial_config(space: SearchSpace) -> None:
    """Micro-batch, accumulation and checkpointing live in the suggestion's trial config, and the estimator's
    settings read them from there (the workload has none)."""
    pinned = space.with_pins({"micro_batch": 4, "grad_accum": 2, "activation_checkpointing": True})
    work = workload()
    suggestion = pinned.suggest(optuna.create_study().ask(), work)
    assert suggestion.trial.batch == (4, 2) and suggestion.trial.activation_checkpointing is True
    settings = resolve(work, suggestion.trial)
    assert (settings.micro_batch, settings.grad_accum, settings.activation_checkpointing) == (4, 2, True)
    assert not {"micro_batch", "grad_accum", "activation_checkpointing"} & set(vars(work.train))


def test_identical_configs_hash_equal(space: SearchSpace) -> None:
    study = optuna.create_study()
    params = {"stage": 2, "micro_batch": 4, "grad_accum": 2, "activation_checkpointing": False}
    study.enqueue_trial(params)
    study.enqueue_trial(params)
    study.enqueue_trial({**params, "micro_batch": 8})
    work = workload()
    pinned = space.restricted(list(params))
    first, second, third = (pinned.suggest(study.ask(), work) for _ in range(3))
    assert first.trial.ds_config == second.trial.ds_config
    assert config_key(first.trial) == config_key(second.trial) == first.key
    assert config_key(first.trial) != config_key(third.trial)
    flipped = TrialConfig(first.trial.ds_config, True)
    assert config_key(flipped) != first.key
    reordered = dict(reversed(list(first.trial.ds_config.items())))
    assert config_key(reordered) == first.key
    assert len(first.key) == 16


# --- malformed spaces ------------------------------------------------------------------------------------------------

GOOD_STAGE = "stage: {kind: categorical, choices: [0, 1, 2, 3], key: zero_optimization.stage, default: 0}"

BAD_SPACES = [
    ("parameters: [1, 2\n", "line 2", "malformed YAML"),
    (f"parameters:\n  {GOOD_STAGE}\n  {GOOD_STAGE}\n", "line 3", "duplicate key 'stage'"),
    ("- just a list\n", "", "must hold a mapping"),
    ("paramters: {}\n", "paramters", "unknown field"),
    ("version: 2\nparameters: {}\n", "version", "must be 1"),
    ("base: {}\n", "parameters", "must be a mapping of name -> parameter, got nothing"),
    ("base: [1]\nparameters: {}\n", "base", "must be a mapping"),
    ("base: {train_batch_size: 8}\nparameters: {}\n", "base.train_batch_size", "set by the space"),
    ("base: {zero_optimization: {stagee: 1}}\nparameters: {}\n", "base.zero_optimization.stagee", "unknown"),
    ("parameters:\n  x: {kind: bool, key: a, default: 1}\n", "parameters.x.kind", "unknown kind 'bool'"),
    ("parameters:\n  x: {key: a, default: 1}\n", "parameters.x.kind", "missing"),
    ("parameters:\n  x: {kind: categorical, key: a, default: 1}\n", "parameters.x.choices", "missing"),
    ("parameters:\n  x: {kind: categorical, choices: [], key: a, default: 1}\n", "parameters.x.choices", "non-empty"),
    ("parameters:\n  x: {kind: categorical, choices: [1, 1], key: a, default: 1}\n", "parameters.x.choices", "twice"),
    ("parameters:\n  x: {kind: categorical, choices: [[1]], key: a, default: 1}\n", "parameters.x.choices", "scalars"),
    ("parameters:\n  x: {kind: int, high: 5, key: a, default: 1}\n", "parameters.x.low", "missing"),
    ("parameters:\n  x: {kind: int, low: 1, key: a, default: 1}\n", "parameters.x.high", "missing"),
    ("parameters:\n  x: {kind: int, low: 9, high: 5, key: a, default: 6}\n", "parameters.x.low", "low 9 > high 5"),
    ("parameters:\n  x: {kind: int, low: 0, high: 5, log: true, key: a, default: 1}\n", "parameters.x.low", "log"),
    ("parameters:\n  x: {kind: float, low: -1.0, high: 5, log: true, key: a, default: 1}\n", "parameters.x.low", "> 0"),
    ("parameters:\n  x: {kind: int, low: 1.5, high: 5, key: a, default: 2}\n", "parameters.x.low", "integer"),
    ("parameters:\n  x: {kind: int, low: 1e7, high: 1e9, key: a, default: 1}\n", "parameters.x.low", "10_000_000"),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, log: yes please, key: a, default: 1}\n", "parameters.x.log", ""),
    (
        "parameters:\n  x: {kind: int, low: 1, high: 8, log: true, step: 2, key: a, default: 1}\n",
        "parameters.x.step",
        "",
    ),
    ("parameters:\n  x: {kind: int, low: 0, high: 9, step: 2, key: a, default: 0}\n", "parameters.x.step", "multiple"),
    (
        "parameters:\n  x: {kind: int, low: 1, high: 8, lwo: 1, key: a, default: 1}\n",
        "parameters.x.lwo",
        "unknown field",
    ),
    (
        "parameters:\n  x: {kind: int, low: 1, high: 8, choices: [1], key: a, default: 1}\n",
        "parameters.x.choices",
        "kind",
    ),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, key: 3, default: 1}\n", "parameters.x.key", "must be a string"),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, key: 'a..b', default: 1}\n", "parameters.x.key", "dotted key"),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, default: 1}\n", "parameters.x", "exactly one of `key`"),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, key: a, train: b, default: 1}\n", "parameters.x", "exactly one"),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, train: seq_len, default: 1}\n", "parameters.x.train", "unknown"),
    (
        "parameters:\n  x: {kind: int, low: 1, high: 8, key: train_batch_size, default: 1}\n",
        "parameters.x.key",
        "derived",
    ),
    (
        "parameters:\n  x: {kind: int, low: 1, high: 8, key: zero_optimization.bucket, default: 1}\n",
        "parameters.x.key",
        "not a DeepSpeed ZeRO key",
    ),
    (
        "parameters:\n  x: {kind: categorical, choices: [a], key: zero_optimization.offload_param.dev, default: a}\n",
        "parameters.x.key",
        "not a DeepSpeed offload_param key",
    ),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, key: a}\n", "parameters.x.default", "missing"),
    (
        "parameters:\n  x: {kind: int, low: 1, high: 8, key: a, default: 9}\n",
        "parameters.x.default",
        "not a value of x",
    ),
    ("parameters:\n  x: {kind: int, low: 1, high: 8, key: a, default: 1, grid: [9]}\n", "parameters.x.grid", "9"),
    ("parameters:\n  x-y: {kind: int, low: 1, high: 8, key: a, default: 1}\n", "parameters.x-y", "identifier"),
    ("parameters:\n  x: [1, 2]\n", "parameters.x", "must be a mapping"),
    (
        "parameters:\n  micro_batch: {kind: int, low: 0, high: 8, key: train_micro_batch_size_per_gpu, default: 1}\n",
        "parameters.micro_batch.low",
        "must be a positive integer",
    ),
    (
        "parameters:\n  m: {kind: categorical, choices: [0, 1], key: gradient_accumulation_steps, default: 1}\n",
        "parameters.m.choices",
        "positive integers",
    ),
    (
        f"parameters:\n  {GOOD_STAGE}\n  x: {{kind: int, low: 1, high: 8, key: a, default: 1, when: stage2 == 3}}\n",
        "parameters.x.when",
        "names unknown parameter 'stage2'",
    ),
    (
        f"parameters:\n  x: {{kind: int, low: 1, high: 8, key: a, default: 1, when: stage == 3}}\n  {GOOD_STAGE}\n",
        "parameters.x.when",
        "defined above",
    ),
    (
        f"parameters:\n  {GOOD_STAGE}\n  x: {{kind: int, low: 1, high: 8, key: a, default: 1, when: stage is 3}}\n",
        "parameters.x.when",
        "cannot read",
    ),
    (
        f"parameters:\n  {GOOD_STAGE}\n  x: {{kind: int, low: 1, high: 8, key: a, default: 1, when: stage == 5}}\n",
        "parameters.x.when",
        "not a value of stage",
    ),
    (
        f"parameters:\n  {GOOD_STAGE}\n  x: {{kind: int, low: 1, high: 8, key: a, default: 1, when: stage in 3}}\n",
        "parameters.x.when",
        "needs a list",
    ),
    (
        f"parameters:\n  {GOOD_STAGE}\n  x: {{kind: int, low: 1, high: 8, key: a, default: 1, when: {{stage: 3}}}}\n",
        "parameters.x.when",
        "condition string",
    ),
    (
        "parameters:\n  a: {kind: int, low: 1, high: 8, key: z.y, default: 1}\n"
        "  b: {kind: int, low: 1, high: 8, key: z.y, default: 1}\n",
        "parameters.b.key",
        "overlaps z.y, set by parameter a",
    ),
    (
        "base: {z: 1}\nparameters:\n  a: {kind: int, low: 1, high: 8, key: z.y, default: 1}\n",
        "parameters.a.key",
        "base.z is not a mapping",
    ),
    (
        "parameters:\n  g: {kind: categorical, choices: [1, 2], key: gradient_accumulation_steps, default: 1}\n"
        "  m: {kind: categorical, choices: [1, 2], key: train_micro_batch_size_per_gpu, default: 1}\n",
        "parameters.g",
        "must come after the micro-batch",
    ),
    (
        "parameters:\n  c: {kind: categorical, choices: [1, 2], train: activation_checkpointing, default: false}\n",
        "parameters.c.choices",
        "true or false",
    ),
]


@pytest.mark.parametrize(("text", "key", "message"), BAD_SPACES)
def test_bad_spaces_raise_space_error_naming_file_and_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = write(tmp_path, text, name="bad.yaml")
    with pytest.raises(SpaceError) as caught:
        load_space(path)
    assert caught.value.file == "bad.yaml"
    assert caught.value.key == key, str(caught.value)
    assert str(caught.value).startswith(f"bad.yaml: {key}: " if key else "bad.yaml: ")
    assert message in str(caught.value)


def test_missing_file_raises_space_error(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match=r"nope\.yaml: no such file"):
        load_space(tmp_path / "nope.yaml")


def test_conditions_with_and_lists_and_ordering(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        parameters:
          stage: {kind: categorical, choices: [0, 1, 2, 3], key: zero_optimization.stage, default: 0}
          dev:
            kind: categorical
            choices: [none, cpu]
            key: zero_optimization.offload_optimizer.device
            default: none
            when: stage >= 1 and stage not in [3]
          bucket:
            kind: int
            low: 1000
            high: 100000
            log: true
            key: zero_optimization.reduce_bucket_size
            default: 10000
            when: ["stage > 0", "dev != none"]
        """,
    )
    space = load_space(path)
    for stage in (0, 1, 2, 3):
        for dev in ("none", "cpu"):
            trial = optuna.create_study().ask()
            suggestion = space.with_pins({"stage": stage, "dev": dev} if stage in (1, 2) else {"stage": stage}).suggest(
                trial, workload((1, 1))
            )
            zero = suggestion.trial.ds_config["zero_optimization"]
            assert ("offload_optimizer" in zero) == (stage in (1, 2))
            assert ("reduce_bucket_size" in zero) == (stage in (1, 2) and dev == "cpu")
    assert [str(c) for c in space.parameter("bucket").when] == ["stage > 0", 'dev != "none"']


def test_bucket_sizes_are_even_as_deepspeed_asserts(tmp_path) -> None:
    """DeepSpeed 0.19 asserts allgather_bucket_size % 2 == 0 when it builds the ZeRO-1/2 optimizer."""
    import optuna

    space = load_space(default_space_path(), pins={"stage": 2})
    workload = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial, workload).trial.ds_config
        assert config["zero_optimization"]["allgather_bucket_size"] % 2 == 0
        study.tell(trial, 1.0)


def test_int_default_written_in_exponent_form_is_an_int(tmp_path: Path) -> None:
    """The format lets large ints be written 5.0e+8 (YAML reads a float): defaults, like pins and grids, accept it."""
    path = write(
        tmp_path,
        """
        parameters:
          reduce_bucket_size:
            kind: int
            low: 1.0e+6
            high: 1.0e+9
            log: true
            key: zero_optimization.reduce_bucket_size
            default: 5.0e+8
        """,
    )
    (parameter,) = [p for p in load_space(path).parameters if p.name == "reduce_bucket_size"]
    assert parameter.default == 500_000_000 and isinstance(parameter.default, int)
