"""Properties of a trial's config over every built-in space and random workloads (Hypothesis).

These would have caught the crash of the plainest ``dstune tune``: the warm start enqueued a config whose
conditional parameter was ``None`` (its YAML default, "DeepSpeed decides"), which Optuna refuses.

- trial params → ds_config → params read back → the same config (:func:`params_of` inverts :meth:`suggest`);
- every config the warm start enqueues into a real Optuna study is accepted by the sampler and the space's
  ``suggest``, and gives the config the warm start ranked;
- a config a retry enqueues (a trial's recorded params) gives the same config again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from bench_space import bench_space
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.forecast import Calibration, ThroughputGuide, params_of
from tuner.space import InfeasibleConfig, SearchSpace, default_space_path, load_space
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model, model_from_param_count

ROOT = Path(__file__).resolve().parents[2]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _spaces() -> dict[str, SearchSpace]:
    """Every space file once (``search_spaces/`` is a link to the built-in folder: its files are not tested twice),
    the bench's space, and the default restricted to the grid's parameters."""
    files = sorted(
        {
            path.resolve()
            for folder in ("tuner/space/builtin", "search_spaces")
            for path in (ROOT / folder).glob("*.yaml")
        }
    )
    spaces = {path.name: load_space(path) for path in files}
    spaces["bench"] = bench_space()
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
        else load_builtin_model(draw(st.sampled_from(MODELS)))
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
        assert all(space.parameter(name).contains(value) for name, value in params.items()), params
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
    values = params_of(space, suggestion.trial)
    study.enqueue_trial({k: v for k, v in values.items() if k in space.searched})
    _, again = _asked(space, study, workload, global_batch)
    assert again.key == suggestion.key
    assert again.trial.ds_config == suggestion.trial.ds_config


class _AllOk:
    """A measurer whose every run is ok (pure logic: the study's records, not DeepSpeed, are under test)."""

    slots = 1

    def submit(self, workload: Workload, trial: TrialConfig, on_step: Any = None) -> Any:
        from concurrent.futures import Future

        from tuner.measure.measurement import Measurement

        future: Future[Measurement] = Future()
        tokens = 1000.0 * trial.ds_config["train_micro_batch_size_per_gpu"]
        future.set_result(Measurement(status="ok", tokens_per_s=tokens, peak_bytes_per_rank=[2**20]))
        return future

    def cancel(self) -> None:
        pass


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(case=workloads(), sampler=st.sampled_from(["tpe", "random", "grid"]))
def test_the_exported_config_estimates_as_its_trial_was_recorded(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[Workload, int | None], sampler: str
) -> None:
    """``dstune best``'s export of every measured trial, with the checkpointing its TrainingArguments carry, gives
    the estimate recorded for that trial; what the export leaves out of the ds_config is said in a note."""
    from tuner.estimator import estimate
    from tuner.space.dsconfig import export_config
    from tuner.storage import Store
    from tuner.study import StudySettings, TuningStudy

    workload, global_batch = case
    url = f"sqlite:///{tmp_path_factory.mktemp('export') / 'dstune.db'}"
    settings_ = StudySettings("export", workload, default_space_path(), global_batch=global_batch, sampler=sampler)
    settings_ = StudySettings(**{**vars(settings_), "trials": 4})
    with Store.open(url) as store:
        study = TuningStudy(settings_, store)
        study.run(_AllOk())
        for trial in store.trials(study.study_id, status="ok"):
            _, notes = export_config(trial.trial, "hf")
            args = json.loads(notes[0].removeprefix("TrainingArguments to use with it: "))
            assert args["gradient_checkpointing"] == trial.activation_checkpointing
            assert args["per_device_train_batch_size"] == trial.ds_config["train_micro_batch_size_per_gpu"]
            plain, plain_notes = export_config(trial.trial)
            exported = TrialConfig(plain, args["gradient_checkpointing"])  # what a user trains from the export
            recorded = {k: v for k, v in trial.estimate.items() if k != "throughput"}
            again = estimate(workload, trial.trial).to_dict()
            assert again == recorded
            outside = [note for note in plain_notes if "expandable_segments" in note]
            if outside:  # a run setting outside DeepSpeed's config: the note names it
                assert outside == [plain_notes[-1]]
            else:  # the notes of an AutoTP or hpZ trial say what the training code does; the config is complete
                assert estimate(workload, exported).to_dict() == recorded
