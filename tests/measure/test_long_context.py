"""Ulysses sequence parallelism and ALST's tiling in measured runs: real DeepSpeed on 2 gloo CPU ranks against one
rank on the same seeded data (the independent truth: the single-rank run's own loss and DeepSpeed's gradient norm).

fp32, gradient clipping off, a tiny transformers LLaMA (GQA: 4 query, 2 key-value heads), and a tiny Qwen2-MoE
(a dense layer, then one of 4 routed experts plus a shared one) whose expert block runs through the tiled MLP.
Step 0's loss and global gradient norm are taken before the optimizer moves anything, so they judge the loss
reduction alone: a share reduced wrongly for the ZeRO stage shows as a gradient norm off by the factor sp.
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from tiny_configs import SP_LLAMA as LLAMA
from tiny_configs import TINY_CONFIGS

from tuner.measure.driver.local_launcher import launch_local
from tuner.measure.run_protocol import RunSpec
from tuner.profile.describe import model_from_config
from tuner.workload import ClusterSpec, TrainSpec, Workload, workload_to_dict

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]
SEQ, MICRO = 64, 2
EXACT = 1e-6  # fp32: the same sums in another order
MOE = {**TINY_CONFIGS["qwen2_moe"], "num_hidden_layers": 2}


def run_spec(
    world: int, stage: int, accum: int = 1, sp: int = 1, true_peak: bool = False, moe: bool = False, **dstune: int
) -> RunSpec:
    workload = Workload(
        model_from_config(MOE, "tiny-qwen2-moe") if moe else model_from_config(LLAMA, "tiny-llama"),
        ClusterSpec(gpus_per_node=world, device="cpu"),
        TrainSpec(seq_len=SEQ, precision="fp32"),
    )
    ds_config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50_000, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        **({"sequence_parallel_size": sp} if sp > 1 else {}),
        **({"dstune": dstune} if dstune else {}),
    }
    return RunSpec(
        workload_to_dict(workload), ds_config, device="cpu", warmup=1, steps=2, probe_memory=False,
        true_peak=true_peak, collective_timeout_s=900,  # a loaded machine starts a peer late: wait on it, not a clock
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict:
    """Six runs shared by the tests: one rank and SP=2 under ZeRO-2; one rank and SP=2 with the tiled MLP and
    loss under ZeRO-3 with two accumulation steps (the SP=2 ZeRO-2 run records its true peak); the MoE model on one
    rank and at SP=2 with its expert block tiled, under ZeRO-2."""
    specs = {
        "one-z2": run_spec(1, 2),
        "sp-z2": run_spec(2, 2, sp=2, true_peak=True),
        "one-z3": run_spec(1, 3, accum=2),
        "sp-z3-tiled": run_spec(2, 3, accum=2, sp=2, tiled_mlp_shards=2, tiled_loss_shards=2),
        "one-moe-z2": run_spec(1, 2, moe=True),
        "sp-moe-z2-tiled": run_spec(2, 2, sp=2, moe=True, tiled_mlp_shards=2),
    }
    results = {name: launch_local(spec, timeout=900) for name, spec in specs.items()}
    for name, result in results.items():
        assert result.status == "ok", f"{name}: {result.error}"
    return results


def first_steps(result) -> list[dict]:
    """Each rank's step-0 loss and global gradient norm (:func:`tuner.measure.rank.numerics.first_step_numerics`)."""
    return [
        {"loss": rank.numerics["step0_loss"], "grad_norm": rank.numerics["step0_grad_norm"]} for rank in result.ranks
    ]


@pytest.mark.parametrize(
    ("reference", "parallel"), [("one-z2", "sp-z2"), ("one-z3", "sp-z3-tiled"), ("one-moe-z2", "sp-moe-z2-tiled")]
)
def test_sp2_first_step_loss_and_grad_norm_equal_one_ranks(runs, reference: str, parallel: str) -> None:
    (one,) = first_steps(runs[reference])
    assert one["loss"] > 0 and one["grad_norm"] > 0
    for rank in first_steps(runs[parallel]):
        assert rank["loss"] == pytest.approx(one["loss"], rel=EXACT)
        assert rank["grad_norm"] == pytest.approx(one["grad_norm"], rel=EXACT)


def test_sp_ranks_report_their_place_and_tokens_and_throughput_counts_samples_once(runs) -> None:
    result = runs["sp-z2"]
    places = [rank.layout for rank in result.ranks]
    assert places == [
        {"sequence_parallel": 2, "sp_rank": sp_rank, "data_parallel": 1, "dp_rank": 0} for sp_rank in (0, 1)
    ]
    assert [rank.tokens_per_micro_batch for rank in result.ranks] == [MICRO * SEQ // 2] * 2
    assert runs["one-z2"].ranks[0].tokens_per_micro_batch == MICRO * SEQ
    # one sample per data-parallel rank per micro-step: 2 samples of 64 tokens a step, not 2 × 2
    assert result.tokens_per_s == pytest.approx(MICRO * SEQ / result.step_time_s["p50"])


def test_an_sp_run_measures_its_true_peak(runs) -> None:
    """The allocator's peak of live tensor bytes: at least the fp32 weights each ZeRO-2 rank holds whole."""
    weights = 4 * model_from_config(LLAMA, "tiny-llama").n_params
    for rank in runs["sp-z2"].ranks:
        assert rank.true_peak["source"]
        assert rank.true_peak_bytes > weights
