"""The recommender's estimate source: the feasible config with the best predicted throughput, saying so, and the
layouts (AutoTP degree × hpZ group) it compared to find it."""

from pathlib import Path
from typing import Any

from tuner.estimator import StepTerms
from tuner.forecast import FAMILY_PREFIX, Calibration, ThroughputFit, judge_grid
from tuner.forecast.layouts import label
from tuner.recommend import GRID, PREDICTION_TIE, Recommendation, _grid_space, recommend
from tuner.requests import WorkloadRequest, to_workload
from tuner.storage import Store
from tuner.workload import ClusterSpec, ParallelLayout, TrainSpec, Workload, load_builtin_model

GIB = 2**30
LLAMA = Workload(
    load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8, gpu_memory=80 * 2**30), TrainSpec(seq_len=4096)
)
# the case: a 70B-class model (the transformers Llama 3.1 70B) on 2 nodes of 8 × 80 GB, bf16, 4096 tokens
LLAMA_70B = {"model": "llama-3.1-70b", "gpus": 8, "nodes": 2, "gpu_memory": "80GiB", "seq_len": 4096}


def recommended(tmp_path: Path, request: dict[str, Any]) -> Recommendation:
    """The recommendation for a workload request (as the API builds it) with nothing measured."""
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        return recommend(store, to_workload(WorkloadRequest(**request)))


def layouts(answer: Recommendation) -> list[dict[str, Any]]:
    assert answer.considered is not None
    return [choice.to_dict() for choice in answer.considered]


def test_nothing_measured_answers_the_best_predicted_feasible_config(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        answer = recommend(store, LLAMA)
    assert answer.source == "estimate" and answer.tokens_per_s is None
    assert answer.prediction is not None and answer.prediction["fit_runs"] == 0 and not answer.prediction["fitted"]
    fitting = [j for j in judge_grid(_grid_space(), LLAMA, Calibration(), names=GRID, equal_batch=True) if j.fits]
    best = max(j.tokens_per_s for j in fitting)
    assert answer.predicted_tokens_per_s >= (1 - PREDICTION_TIE) * best
    assert any(j.trial.ds_config == answer.trial.ds_config for j in fitting)


def test_fitted_constants_of_the_hardware_and_family_move_the_answer(tmp_path: Path) -> None:
    """Runs on this hardware said collectives and hooks cost 10,000× the table: ZeRO-3 (a fetch per parameter and
    pass) drops out of the answer."""
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        table = recommend(store, LLAMA)
        fit = ThroughputFit()
        for latency in (1.0, 2.0, 4.0):
            fit = fit.after_run(StepTerms(1.0, 0.0, 0.0, latency, 0.0), 1.0 + 10_000 * latency)
        store.put_calibration(f"cuda:{80 * 2**30}", FAMILY_PREFIX + "llama", 0.0, len(fit.runs), fit.to_stats())
        fitted = recommend(store, LLAMA)
    assert table.trial.ds_config["zero_optimization"]["stage"] == 3  # 7B on 8 × 80 GB: only ZeRO-3 fits a large batch
    assert fitted.prediction["fitted"] and fitted.prediction["fit_runs"] == 3
    assert fitted.prediction["factors"]["latency"] > 1000
    assert fitted.trial.ds_config != table.trial.ds_config


def test_70b_on_two_nodes_weighs_tensor_parallel_and_hpz_layouts_and_says_why_its_own_wins(tmp_path: Path) -> None:
    """Nothing measured: every AutoTP degree and hpZ group the default space offers the workload is judged, the
    answer fits with the margin and is the fastest predicted of them (within the tie), and ``why`` names its layout
    against the next fitting one."""
    answer = recommended(tmp_path, LLAMA_70B)
    assert answer.source == "estimate" and answer.predicted_tokens_per_s is not None
    assert answer.estimated_peak_bytes is not None
    assert answer.estimated_peak_bytes * (1 + answer.margin) <= 80 * GIB
    considered = layouts(answer)
    assert {c["tensor_parallel"] for c in considered} == {1, 2, 4, 8}  # 64 heads, 8 key-value heads, 8 GPUs a node
    assert {c["hpz_partition_size"] for c in considered} == {1, 2, 4, 8}
    assert not [c for c in considered if c["tensor_parallel"] > 1 and c["hpz_partition_size"] > 1]  # refused
    assert any(c["tensor_parallel"] > 1 and c["fits"] for c in considered)
    assert any(c["hpz_partition_size"] > 1 and c["fits"] for c in considered)
    (chosen,) = [c for c in considered if c["chosen"]]
    layout = answer.trial.layout
    assert (chosen["tensor_parallel"], chosen["hpz_partition_size"]) == (
        layout.tensor_parallel,
        layout.hpz_partition_size,
    )
    assert chosen["predicted_tokens_per_s"] == answer.predicted_tokens_per_s
    assert chosen["estimated_peak_bytes"] == answer.estimated_peak_bytes
    fitting = [c for c in considered if c["fits"]]
    assert considered[: len(fitting)] == fitting  # fitting layouts first
    speeds = [c["predicted_tokens_per_s"] for c in fitting]
    assert speeds == sorted(speeds, reverse=True)
    assert answer.predicted_tokens_per_s >= (1 - PREDICTION_TIE) * speeds[0]
    for unfit in considered[len(fitting) :]:
        assert unfit["predicted_tokens_per_s"] is None and unfit["reason"].startswith("needs ")
    runner = next(c for c in fitting if not c["chosen"])
    runner_label = label(
        ParallelLayout(tensor_parallel=runner["tensor_parallel"], hpz_partition_size=runner["hpz_partition_size"])
    )
    assert answer.why is not None and answer.why.startswith(f"{label(layout)}: ")
    assert f"the next layout ({runner_label}, " in answer.why
    assert f"{len(fitting)} of {len(considered)} layouts fit" in answer.why


def test_layouts_are_judged_at_the_global_batch_data_parallelism_trains(tmp_path: Path) -> None:
    """tp=2 on 16 ranks has 8 data-parallel ranks: at accumulation 1 it would train half the samples per optimizer
    step of tp=1 at the same micro-batch, and its predicted tokens/s would carry the (CPU Adam) step's cost over half
    the tokens. Each layout accumulates over the ranks it takes from data parallelism instead."""
    considered = layouts(recommended(tmp_path, LLAMA_70B))
    assert any(c["tensor_parallel"] > 1 for c in considered)
    for choice in considered:
        assert choice["grad_accum"] == choice["tensor_parallel"] * choice["sequence_parallel"]
        assert choice["global_batch"] == choice["micro_batch"] * 16


def test_a_moe_model_is_offered_autoep_layouts_and_a_dense_one_none(tmp_path: Path) -> None:
    """Mixtral 8x7B on 8 × 80 GB: AutoEP degrees dividing its 8 experts and the 8 ranks are judged beside plain data
    parallelism (EP splits the experts, not the batch: no accumulation added); the 70B dense model gets none."""
    moe = recommended(tmp_path, {"model": "mixtral-8x7b", "gpus": 8, "gpu_memory": "80GiB", "seq_len": 4096})
    considered = layouts(moe)
    assert {c["expert_parallel"] for c in considered} == {1, 2, 4, 8}
    assert all(c["grad_accum"] == 1 for c in considered)
    chosen = moe.trial.layout
    if chosen.expert_parallel > 1:
        assert moe.trial.ds_config["expert_parallel"] == {"autoep_size": chosen.expert_parallel, "enabled": True}
    assert {c["expert_parallel"] for c in layouts(recommended(tmp_path, LLAMA_70B))} == {1}


def test_one_node_offers_no_hpz_layout(tmp_path: Path) -> None:
    """hpZ only across nodes (the 70B does not fit one node of 8 × 80 GB at all: an 8B model)."""
    considered = layouts(recommended(tmp_path, {**LLAMA_70B, "model": "llama-3-8b", "nodes": 1}))
    assert {c["hpz_partition_size"] for c in considered} == {1}
    assert {c["tensor_parallel"] for c in considered} == {1, 2, 4, 8}


def test_a_model_under_a_billion_parameters_is_offered_no_tensor_parallel_layout(tmp_path: Path) -> None:
    answer = recommended(tmp_path, {"model": "gpt2", "gpus": 8, "nodes": 2, "gpu_memory": "24GiB", "seq_len": 1024})
    considered = layouts(answer)
    assert {c["tensor_parallel"] for c in considered} == {1}
    assert {c["hpz_partition_size"] for c in considered} == {1, 2, 4, 8}  # ZeRO-3 across the 2 nodes
    assert answer.why is not None and answer.why.startswith(label(answer.trial.layout) + ": ")
