"""Warm starts from the throughput model: feasible ranking, earlier configs re-checked, the guide on a real
landscape (the CPU landscape measured for bench/search_efficiency.py, replayed: no runs)."""

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from bench_space import bench_space

from tuner.estimator import ConfigError, estimate
from tuner.forecast import (
    COARSE,
    FAMILY_PREFIX,
    Calibration,
    ThroughputFit,
    ThroughputGuide,
    grid_suggestions,
    params_of,
    rank_feasible,
    recheck_earlier,
    spearman,
)
from tuner.space import InfeasibleConfig, default_space_path, load_space
from tuner.storage import Store
from tuner.units import parse_bytes
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPE = ROOT / "bench" / "results" / "landscapes" / "tiny-llama-s128-w1.json"
GPT2 = Workload(
    load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=8, gpu_memory=16 * 2**30), TrainSpec(seq_len=1024)
)


def label(params: dict) -> str:
    return json.dumps({k: params[k] for k in ("stage", "micro_batch", "activation_checkpointing")}, sort_keys=True)


def test_rank_feasible_keeps_what_fits_fastest_first() -> None:
    space = load_space(default_space_path())
    ranked = rank_feasible(space, GPT2, Calibration(), global_batch=256)
    assert ranked and len({r.suggestion.key for r in ranked}) == len(ranked)
    speeds = [r.prediction.tokens_per_s for r in ranked]
    assert speeds == sorted(speeds, reverse=True)
    for r in ranked:
        est = estimate(GPT2, r.suggestion.trial)
        assert est.gpu_total * 1.05 <= est.gpu_memory
    # a tighter GPU drops configs, and never adds one
    small = replace(GPT2, cluster=replace(GPT2.cluster, gpu_memory=8 * 2**30))
    fewer = rank_feasible(space, small, Calibration(), global_batch=256)
    assert 0 < len(fewer) < len(ranked) and {r.suggestion.key for r in fewer} <= {r.suggestion.key for r in ranked}


def test_grid_suggestions_skip_repeats_without_losing_a_config() -> None:
    """Skipping grid points that agree with an earlier one on every parameter the space asked for gives the configs
    that suggesting every point and dropping repeated keys gives, in the same order (a space with conditions on
    stage and on offload, a layout parameter on the workload, hpZ across 2 nodes)."""
    names = ["stage", "offload_optimizer", "offload_param", "threads_per_rank", "tensor_parallel", "hpz_partition_size"]
    space = load_space(default_space_path()).restricted(names)
    work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=2, nodes=2), TrainSpec(seq_len=512))
    grid = space.grid([n for n in names if n in space.searched], world_size=work.cluster.world_size)
    every: list[str] = []
    for point in itertools.product(*grid.values()):
        try:
            key = space.suggest(_Answers(dict(zip(grid, point, strict=True)), space), work).key
        except (InfeasibleConfig, ConfigError):
            continue
        every += [key] * (key not in every)
    assert [s.key for s in grid_suggestions(space, work, names)] == every
    assert len(every) > 50


class _Answers:
    """A trial answering from ``values``, else each parameter's default (what the grid holds fixed)."""

    def __init__(self, values: dict, space: object) -> None:
        self.values = values
        self.defaults = {p.name: p.searchable_default() for p in space.parameters}  # type: ignore[attr-defined]

    def suggest_categorical(self, name: str, choices: list) -> object:
        value = self.values.get(name, self.defaults[name])
        if value not in choices:  # a point the study's Optuna distributions would refuse
            raise InfeasibleConfig(f"{name} {value!r} is not offered")
        return value

    def suggest_int(self, name: str, *args: object, **kwargs: object) -> object:
        return self.values.get(name, self.defaults[name])

    suggest_float = suggest_int


def test_params_of_reads_a_config_back_into_the_space() -> None:
    space = load_space(default_space_path())
    for r in rank_feasible(space, GPT2, Calibration(), global_batch=256)[:20]:
        params = params_of(space, r.suggestion.trial)
        earlier = [r.suggestion.trial]
        again = recheck_earlier(space, GPT2, Calibration(), earlier, global_batch=256)
        assert params["stage"] == r.params["stage"] and again[0].suggestion.key == r.suggestion.key


def test_warm_start_puts_earlier_configs_that_still_fit_first_and_spreads_over_batch_shapes() -> None:
    space = load_space(default_space_path())
    guide = ThroughputGuide(space, GPT2, Calibration(), global_batch=256)
    big = {"train_micro_batch_size_per_gpu": 32, "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}
    small = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    assert not rank_feasible(space.with_pins({"stage": 0, "micro_batch": 32}), GPT2, Calibration(), global_batch=256)
    chosen = guide.warm_start(3, earlier=[TrialConfig(big), TrialConfig(small, True)])
    assert (chosen[0]["stage"], chosen[0]["micro_batch"], chosen[0]["activation_checkpointing"]) == (3, 1, True)
    shapes = [(p["micro_batch"], p["activation_checkpointing"]) for p in chosen]
    assert len(set(shapes)) == 3


def _replay_landscape() -> tuple[dict, Workload, dict]:
    data = json.loads(LANDSCAPE.read_text())
    spec = data["workload"]
    work = Workload(
        load_builtin_model(spec["model"]),
        ClusterSpec(gpus_per_node=spec["world_size"], device="cpu", gpu_memory=parse_bytes(spec["gpu_memory"])),
        TrainSpec(seq_len=spec["seq_len"], precision=spec["precision"]),
    )
    measured = {label(p["params"]): p["tokens_per_s"] for p in data["points"] if p["tokens_per_s"]}
    return spec, work, measured


def test_guide_reaches_the_best_of_a_measured_landscape_in_three_runs_and_ranks_it() -> None:
    """The tiny-llama CPU landscape (23 feasible configs measured): the guide's warm start and picks measure the
    fastest config by the third run, and after five runs the refitted model ranks the whole landscape with
    Spearman ≥ 0.8 (the table alone: about 0.9; the order of the few fast ones is what it gets wrong)."""
    spec, work, measured = _replay_landscape()
    space = bench_space()
    guide = ThroughputGuide(space, work, Calibration(), global_batch=spec["global_batch"])
    by_params = {label(r.params): r for r in guide.ranked}
    assert guide.next_pick() is None  # nothing measured yet: the warm start goes first
    queue = guide.warm_start()
    seen: list[float] = []
    while len(seen) < 5:
        params = queue.pop(0) if queue else guide.next_pick()
        assert params is not None
        key = label(params)
        tokens = measured[key]
        seen.append(tokens)
        guide.after_run(by_params[key].suggestion, spec["global_batch"] * spec["seq_len"] / tokens, tokens)
    assert len(seen) == 5 and max(seen[:3]) == max(measured.values())
    ranked = [r for r in guide.ranked if label(r.params) in measured]
    rho = spearman([guide.predicted_tokens_per_s(r) for r in ranked], [measured[label(r.params)] for r in ranked])
    assert rho >= 0.8


def test_five_random_runs_fit_constants_that_rank_the_landscape() -> None:
    """Any 5 measured configs, not only the guide's: over 100 random draws, the median Spearman ≥ 0.9 and at least
    90 % of the draws reach 0.8."""
    spec, work, measured = _replay_landscape()
    guide = ThroughputGuide(bench_space(), work, Calibration(), global_batch=spec["global_batch"])
    ranked = [r for r in guide.ranked if label(r.params) in measured]
    truth = [measured[label(r.params)] for r in ranked]
    tokens_per_step = spec["global_batch"] * spec["seq_len"]
    rng = random.Random(0)
    rhos = []
    for _ in range(100):
        fit = ThroughputFit()
        for r in rng.sample(ranked, 5):
            fit = fit.after_run(r.terms, tokens_per_step / measured[label(r.params)])
        rhos.append(spearman([tokens_per_step / fit.predict_s(r.terms) for r in ranked], truth))
    rhos.sort()
    assert rhos[50] >= 0.9 and rhos[10] >= 0.8


def test_guide_with_a_store_keeps_its_refits(tmp_path: Path) -> None:
    spec, work, _ = _replay_landscape()
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        with pytest.raises(ValueError, match="hardware"):
            ThroughputGuide(bench_space(), work, Calibration(), store=store)
        guide = ThroughputGuide(
            bench_space(), work, Calibration(), global_batch=spec["global_batch"], store=store, hardware="cpu"
        )
        first = guide.ranked[0]
        guide.after_run(first.suggestion, 0.5, spec["global_batch"] * spec["seq_len"] / 0.5)
        row = store.get_calibration("cpu", FAMILY_PREFIX + "llama")
        assert row is not None and row.samples == 1
        again = ThroughputGuide(
            bench_space(), work, Calibration(), global_batch=spec["global_batch"], store=store, hardware="cpu"
        )
        assert again.fit.factors == guide.fit.factors != {}
        assert pytest.approx(again.fit.predict_s(first.terms)) == guide.fit.predict_s(first.terms)


def test_with_threads_searched_the_first_runs_try_the_fastest_config_at_each_thread_count() -> None:
    """The throughput model cannot tell what threads per rank do (only a run shows it): with ``--search-threads``
    the warm start measures the predicted-fastest config at the launcher's rule and at each thread count first."""
    work = Workload(
        load_builtin_model("tiny-gpt2"),
        ClusterSpec(gpus_per_node=2, device="cpu", gpu_memory=64 * 2**20),
        TrainSpec(seq_len=64),
    )
    space = load_space(default_space_path())
    space = space.with_choices("threads_per_rank", lambda threads: threads in (None, 1, 2))
    first = ThroughputGuide(space, work, Calibration()).warm_start()
    assert [params["threads_per_rank"] for params in first] == [None, 1, 2]
    assert len({(params["stage"], params["micro_batch"]) for params in first}) == 1


def test_a_sequence_too_long_for_data_parallel_warm_starts_from_the_layouts_that_fit() -> None:
    """8,192 tokens of a Qwen2-shaped transformers model on 2 CPU ranks of 46 MiB: no config of the coarse grid fits
    (the logits alone are 128 MiB), so the guide ranks the memory savers' grid, Ulysses and ALST's tiling included,
    and the study's first runs are sequence-parallel configs that fit."""
    pytest.importorskip("transformers")
    from tuner.profile import model_from_config

    config = {
        "model_type": "qwen2", "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 384,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 16384, "tie_word_embeddings": False,
    }  # fmt: skip
    cluster = ClusterSpec(gpus_per_node=2, device="cpu", gpu_memory=46 * 2**20)
    work = Workload(model_from_config(config, "qwen2-long"), cluster, TrainSpec(seq_len=8192))
    space = load_space(default_space_path())
    assert not rank_feasible(space, work, Calibration(), global_batch=2, names=COARSE)
    guide = ThroughputGuide(space, work, Calibration(), global_batch=2)
    assert guide.ranked and all(r.suggestion.trial.layout.sequence_parallel == 2 for r in guide.ranked)
    first = guide.warm_start()
    assert first and all(params["sequence_parallel"] == 2 for params in first)


def test_after_the_warm_start_failed_the_guide_picks_what_still_fits_with_the_learned_margin() -> None:
    """Nothing measured: once the warm start's configs were proposed (and ran out of memory), the next pick is the
    best predicted config left, among those that fit with the margin the failures taught; none when none fits."""
    guide = ThroughputGuide(load_space(default_space_path()), GPT2, Calibration())
    assert guide.next_pick() is None  # nothing proposed yet: the warm start goes first
    first = guide.warm_start()
    assert first
    tighter = Calibration(margin=0.5)
    guide.recalibrate(tighter)
    assert guide.ranked and all(tighter.fits(r.estimate.gpu_total, r.estimate.gpu_memory) for r in guide.ranked)
    pick = guide.next_pick()
    assert pick is not None and pick not in first
    guide.recalibrate(Calibration(margin=1e6))
    assert guide.next_pick() is None
