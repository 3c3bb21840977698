"""The numerics choices of a study (``tune --allow-numerics-changes``): absent without the option, offered where
DeepSpeed takes them with it, their pins, and a study that fits only with bf16 master weights (the real TuningStudy
on SQLite, measuring through a fake that answers every run ok)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import optuna
import pytest

from tuner.estimator import estimate
from tuner.measure.measurement import Measurement, StepHook
from tuner.space import SpaceError, default_space_path, load_space
from tuner.space.dsconfig import export_config
from tuner.space.numerics_choices import NUMERICS_PARAMETERS, load_study_space
from tuner.storage import Store
from tuner.study import StudySettings, TuningStudy
from tuner.workload import (
    ClusterSpec,
    TrainableSpec,
    TrainSpec,
    TrialConfig,
    Workload,
    load_builtin_model,
    model_from_param_count,
)
from tuner.workload.hf_config import model_from_hf_config

optuna.logging.set_verbosity(optuna.logging.WARNING)
DEFAULT = default_space_path()
TINY = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(128))
# 29.5M parameters: fp32-master Adam at ZeRO-1 on one rank needs about 507 MiB, bf16 master weights and optimizer
# states about 338 MiB, Muon with an fp32 master about 435 MiB (the estimator's figures)
MEMORY_BOUND = {"model_type": "gpt2", "vocab_size": 8192, "n_positions": 128, "n_embd": 512, "n_layer": 8, "n_head": 8}
PINS = {
    "stage": 1,
    "offload_optimizer": "none",
    "reduce_bucket_size": 10_000_000,
    "allgather_bucket_size": 10_000_000,
    "micro_batch": 1,
}


def test_without_the_option_the_space_is_the_space_file() -> None:
    plain = load_space(DEFAULT)
    space = load_study_space(DEFAULT, {}, TINY, allowed=False)
    assert space.names == plain.names and not set(NUMERICS_PARAMETERS) & set(space.names)
    with pytest.raises(SpaceError, match="bf16_master_weights"):
        load_study_space(DEFAULT, {"bf16_master_weights": True}, TINY, allowed=False)


def test_with_the_option_each_choice_only_where_deepspeed_takes_it() -> None:
    space = load_study_space(DEFAULT, {}, TINY, allowed=True)
    assert space.names[: len(load_space(DEFAULT).names)] == load_space(DEFAULT).names  # the file's own first
    assert set(NUMERICS_PARAMETERS) <= set(space.searched)
    assert [str(c) for c in space.parameter("bf16_master_weights").when] == ["stage >= 1"]
    assert 'offload_optimizer == "none"' in [str(c) for c in space.parameter("muon").when]
    fp16 = Workload(TINY.model, TINY.cluster, TrainSpec(128, precision="fp16"))
    assert "bf16_master_weights" not in load_study_space(DEFAULT, {}, fp16, allowed=True).names
    bare = Workload(model_from_param_count(1e8), TINY.cluster)
    assert "muon" not in load_study_space(DEFAULT, {}, bare, allowed=True).names  # its split needs shapes
    adapter = Workload(TINY.model, TINY.cluster, TINY.train, trainable=TrainableSpec(freeze="embed"))
    assert "muon" not in load_study_space(DEFAULT, {}, adapter, allowed=True).names
    script = load_study_space(DEFAULT, {}, TINY, allowed=True, script=True)
    assert "chunked_loss" not in script.names and "bf16_master_weights" in script.names  # a command's loss is its own


def test_numerics_pins_by_name_or_key_with_the_option() -> None:
    space = load_study_space(DEFAULT, {"bf16.bf16_master_weights_and_grads": True}, TINY, allowed=True)
    assert space.pins["bf16_master_weights"] is True
    muon = load_study_space(DEFAULT, {"muon": "Muon", "stage": 2}, TINY, allowed=True)
    # where Muon applies; AutoTP and AutoEP cannot apply to TINY (a small dense model): they stay 1, unpinned
    implied = {"offload_optimizer": "none"}
    assert muon.pins == {"muon": "Muon", "stage": 2, **implied}


def test_every_suggested_config_is_one_deepspeed_takes() -> None:
    space = load_study_space(DEFAULT, {}, TINY, allowed=True)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    made = set()
    for _ in range(60):
        trial = study.ask()
        try:
            suggestion = space.suggest(trial, TINY, global_batch=8)
        except Exception as error:  # pruned: only the refusals DeepSpeed itself makes, each naming its key
            assert "invalid config" in str(error) or "applies only" in str(error) or "micro" in str(error), error
            continue
        finally:
            study.tell(trial, 0.0)
        made.add(tuple(suggestion.trial.numerics.labels()))
    assert ("bf16 master weights and gradients", "bf16 optimizer states") in made and () in made


class AllOk:
    """A measurer whose every run is ok (the study's estimator gate decides what runs)."""

    slots = 1

    def __init__(self) -> None:
        self.measured: list[TrialConfig] = []

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        self.measured.append(trial)
        future: Future[Measurement] = Future()
        future.set_result(Measurement(status="ok", tokens_per_s=1000.0, peak_bytes_per_rank=[2**20]))
        return future

    def cancel(self) -> None:
        pass


def memory_bound() -> Workload:
    cluster = ClusterSpec(gpus_per_node=1, device="cpu", gpu_memory=400 * 2**20)
    return Workload(model_from_hf_config(MEMORY_BOUND), cluster, TrainSpec(64))


def run_study(store: Store, name: str, allowed: bool) -> tuple[TuningStudy, AllOk]:
    settings = StudySettings(
        name=name,
        workload=memory_bound(),
        space_path=DEFAULT,
        pins=PINS,
        global_batch=1,
        trials=4,
        seed=3,
        allow_numerics_changes=allowed,
    )
    study, measurer = TuningStudy(settings, store), AllOk()
    study.run(measurer)
    return study, measurer


def test_a_memory_bound_study_fits_only_with_bf16_master_weights_and_says_so(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        plain, nothing = run_study(store, "plain", allowed=False)
        assert not nothing.measured, "without the option every config is pruned by the estimator"
        assert all(t.status == "pruned" for t in store.trials(plain.study_id))

        study, measurer = run_study(store, "allowed", allowed=True)
        assert measurer.measured and all(trial.numerics.bf16_master for trial in measurer.measured)
        record = store.get_study("allowed")
        assert record is not None and record.settings["allow_numerics_changes"] is True
        best = store.best_trial(study.study_id)
        assert best is not None and best.trial.numerics.bf16_master
        fp32 = {k: v for k, v in best.trial.ds_config["bf16"].items() if k == "enabled"}
        assert not estimate(memory_bound(), TrialConfig({**best.trial.ds_config, "bf16": fp32})).fits
        _, notes = export_config(best.trial, "deepspeed")
        assert any("changes the numerics" in note and "bf16 master weights" in note for note in notes), notes
