"""What ``dstune best`` exports where the fastest config is not the answer for the target: ``--format hf`` on a
Ulysses study (the Trainer's loss reduction gives sp times the gradient below ZeRO-3) and a ``--seq-len max``
search's name without its length. Studies written to the store directly (no run)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

runner = CliRunner()


def study_of(store: Store, name: str, stages_tokens: list[tuple[int, float]]) -> None:
    """A study of the transformers tiny LLaMA on 2 CPU ranks whose ok trials run Ulysses 2 at these stages."""
    model = replace(load_builtin_model("tiny-llama"), implementation="transformers")
    work = Workload(model, ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=256))
    study = store.get_or_create_study(name, store.upsert_workload(work), "tpe", {})
    for number, (stage, tokens) in enumerate(stages_tokens):
        config = {**shortcut_config(1, 1, "bf16", stage, "none", "none"), "sequence_parallel_size": 2}
        config["train_batch_size"] = 1
        trial_id = store.add_trial(study.id, number, f"k{number}", config, {}, False, None)
        store.start_trial(trial_id)
        store.finish_trial(trial_id, "ok", {"status": "ok", "tokens_per_s": tokens, "peak_bytes_per_rank": [2**20]})


def test_hf_export_of_a_ulysses_study_takes_the_fastest_config_the_trainer_trains_right(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with Store.open(url) as store:
        study_of(store, "sp", [(2, 900.0), (3, 700.0)])
        study_of(store, "sp-zero2", [(1, 900.0), (2, 800.0)])
    out = tmp_path / "ds.json"
    result = runner.invoke(app, ["best", "--study", "sp", "--format", "hf", "--storage", url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["zero_optimization"]["stage"] == 3
    assert "exported trial 1" in result.stderr and "trains 2x the gradient" in result.stderr
    plain = runner.invoke(app, ["best", "--study", "sp", "--storage", url])  # DeepSpeed's own loop: the fastest
    assert plain.exit_code == 0 and json.loads(plain.stdout)["zero_optimization"]["stage"] == 2
    none = runner.invoke(app, ["best", "--study", "sp-zero2", "--format", "hf", "--storage", url])
    assert none.exit_code == 2 and none.stderr.count("\n") == 1, none.output
    assert none.stderr.startswith("error: format: no measured config of study 'sp-zero2' is right for the HF Trainer")
    assert "trains 2x the gradient" in none.stderr and "it measured no ZeRO-3 trial" in none.stderr
    assert "with --pin stage=3 --study sp-zero2 (its ZeRO-3 trials join the study)" in none.stderr


def test_a_length_searchs_name_exports_its_longest_length_that_trained(tmp_path: Path) -> None:
    """``best --study lc5`` after ``tune --seq-len max --study lc5``: the search's lengths are studies of their own;
    the bare name exports the longest that trained within the memory (2,560 here: 2,816 ran out of memory), and says
    which. It pointed to ``lc5:2816``, whose export fails for want of a measured trial."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with Store.open(url) as store:
        for length in (2304, 2560):
            study_of(store, f"lc5:{length}", [(2, 900.0 + length)])
        study_of(store, "lc5:2816", [])
        trial_id = store.add_trial(
            store.get_study("lc5:2816").id, 0, "k0", shortcut_config(1, 1, "bf16", 3, "none", "none"), {}, False, None
        )
        store.start_trial(trial_id)
        store.finish_trial(trial_id, "oom", {"status": "oom"})
        study_of(store, "lc6:1024", [])
    result = runner.invoke(app, ["best", "--study", "lc5", "--storage", url])
    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)
    assert exported == json.loads(runner.invoke(app, ["best", "--study", "lc5:2560", "--storage", url]).stdout)
    assert "exported lc5:2560, the longest length that trained within the memory (2,560 tokens)" in result.stderr
    assert "(lc5:2816, lc5:2560, lc5:2304)" in result.stderr
    none = runner.invoke(app, ["best", "--study", "lc6", "--storage", url])
    assert none.exit_code == 2 and none.stderr.count("\n") == 1
    assert "no length of the --seq-len max search lc6 trained within the memory yet: lc6:1024" in none.stderr
    missing = runner.invoke(app, ["best", "--study", "lc7", "--storage", url])
    assert missing.exit_code == 2 and "no study named 'lc7'" in missing.stderr


def test_hf_export_with_only_failed_zero3_trials_says_how_they_ended(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with Store.open(url) as store:
        study_of(store, "sp", [(1, 900.0)])
        study = store.get_study("sp")
        config = {**shortcut_config(1, 1, "bf16", 3, "none", "none"), "sequence_parallel_size": 2}
        trial_id = store.add_trial(study.id, 1, "k-oom", {**config, "train_batch_size": 1}, {}, False, None)
        store.start_trial(trial_id)
        store.finish_trial(trial_id, "oom", {"status": "oom", "peak_bytes_per_rank": [2**20]})
    none = runner.invoke(app, ["best", "--study", "sp", "--format", "hf", "--storage", url])
    assert none.exit_code == 2 and "its ZeRO-3 trials did not train (oom 1)" in none.stderr, none.output
