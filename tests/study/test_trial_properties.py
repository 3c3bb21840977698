"""Properties of a trial's config over every built-in space and random workloads (Hypothesis).

These would have caught the crash of the plainest ``dstune tune``: the warm start enqueued a config whose
conditional parameter was ``None`` (its YAML default, "DeepSpeed decides"), which Optuna refuses.

- trial params → ds_config → params read back → the same config (:func:`params_of` inverts :meth:`suggest`);
- every config the warm start enqueues into a real Optuna study is accepted by the sampler and the space's
  ``suggest``, and gives the config the warm start ranked;
- a config a retry enqueues (a trial's recorded params) gives the same config again.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.space import InfeasibleConfig, SearchSpace, default_space_path, load_space, parse_space
from tuner.study.calibration import Calibration
from tuner.study.warm_start import ThroughputGuide, params_of
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_model, model_from_param_count

ROOT = Path(__file__).resolve().parents[2]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _bench_space() -> SearchSpace:
    tree = ast.parse((ROOT / "bench" / "search_efficiency.py").read_text())
    text = next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SPACE_YAML"
    )
    return parse_space(yaml.safe_load(text), "search_efficiency.yaml")


def _spaces() -> dict[str, SearchSpace]:
    spaces = {path.name: load_space(path) for path in sorted((ROOT / "tuner" / "space" / "builtin").glob("*.yaml"))}
    spaces |= {f"search_spaces/{p.name}": load_space(p) for p in sorted((ROOT / "search_spaces").glob("*.yaml"))}
    spaces["bench"] = _bench_space()
    spaces["default, restricted to the grid's"] = load_space(default_space_path()).restricted(["stage", "micro_batch"])
    return spaces


SPACES = _spaces()
MODELS = ("tiny-gpt2", "tiny-llama", "gpt2", "llama-2-7b", "qwen2-1.5b", "mistral-7b")


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Workload, int | None]:
    """A workload (a preset or a bare count, a cluster, a memory budget from tight to ample) and a global batch."""
    bare = draw(st.booleans())
    model = (
        model_from_param_count(draw(st.sampled_from([1e6, 1.2e8, 7e9])))
        if bare
        else load_model(draw(st.sampled_from(MODELS)))
    )
    gpus, nodes = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2]))
    cluster = ClusterSpec(
        gpus_per_node=gpus,
        nodes=nodes,
        gpu_memory=draw(st.sampled_from([64 * 2**20, 2**30, 16 * 2**30, 80 * 2**30])),
        device=draw(st.sampled_from(["cpu", "cuda"])),
    )
    train = TrainSpec(seq_len=draw(st.sampled_from([64, 128, 2048])), precision=draw(st.sampled_from(["bf16", "fp32"])))
    world = gpus * nodes
    global_batch = draw(st.one_of(st.none(), st.sampled_from([world, 4 * world, 16 * world, 64 * world])))
    return Workload(model, cluster, train), global_batch


def _asked(space: SearchSpace, study: optuna.Study, workload: Workload, global_batch: int | None) -> Any:
    """Ask the study once and let the space suggest from that trial (what the tuning loop does)."""
    trial = study.ask()
    return trial, space.suggest(trial, workload, global_batch)


@pytest.mark.parametrize("space_name", list(SPACES))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads())
def test_every_warm_start_config_is_accepted_by_the_study_and_the_space(
    space_name: str, case: tuple[Workload, int | None]
) -> None:
    workload, global_batch = case
    space = SPACES[space_name]
    guide = ThroughputGuide(space, workload, Calibration(), global_batch=global_batch)
    enqueued = guide.warm_start()
    ranked = {r.suggestion.key for r in guide.ranked}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    for params in enqueued:
        assert all(value is not None for value in params.values()), params
        study.enqueue_trial(params)
        trial, suggestion = _asked(space, study, workload, global_batch)
        assert suggestion.key in ranked  # the config the warm start ranked, not a neighbour
        study.tell(trial, 1.0)
        # a retry re-enqueues the trial's recorded params: the same config again
        study.enqueue_trial(dict(study.trials[-1].params), skip_if_exists=False)
        again_trial, again = _asked(space, study, workload, global_batch)
        assert again.key == suggestion.key
        study.tell(again_trial, 1.0)


@pytest.mark.parametrize("space_name", list(SPACES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads(), seed=st.integers(0, 2**16))
def test_params_to_ds_config_and_back_is_the_same_config(
    space_name: str, case: tuple[Workload, int | None], seed: int
) -> None:
    workload, global_batch = case
    space = SPACES[space_name]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    try:
        _, suggestion = _asked(space, study, workload, global_batch)
    except InfeasibleConfig:
        return  # pruned without a config: nothing to round-trip
    values = params_of(space, suggestion.ds_config, suggestion.activation_checkpointing)
    study.enqueue_trial({k: v for k, v in values.items() if k in space.searched})
    _, again = _asked(space, study, workload, global_batch)
    assert again.key == suggestion.key
    assert again.ds_config == suggestion.ds_config
