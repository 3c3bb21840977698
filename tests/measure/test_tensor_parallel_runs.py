"""AutoTP tensor parallelism in measured runs through the product's runner: real DeepSpeed on 2 and 4 gloo CPU ranks
(the local launcher, :mod:`tuner.measure.rank.training`) against one rank on the same seeded data (the independent
truth: the single-rank run's own loss and DeepSpeed's gradient norm).

ZeRO++ hpZ (``zero_hpz_partition_size``) is plain data parallelism with a secondary 16-bit partition inside each
node: its run is checked the same way.

fp32, gradient clipping off, a tiny transformers LLaMA (4 query, 2 key-value heads, untied head). Every run trains
on the same global batch of 4 samples: one rank with micro-batch 4, TP 2 with micro-batch 4 (one tensor-parallel
group: one data-parallel rank), TP 2 × DP 2 with micro-batch 2 and ``train_batch_size`` 4 = micro × accumulation ×
dp (DeepSpeed's own check would count all 4 ranks: the runner leaves the global batch to it under AutoTP).
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from tiny_configs import SP_LLAMA

from tuner.measure.driver.local_launcher import launch_local
from tuner.measure.run_protocol import RunSpec
from tuner.profile.describe import model_from_config
from tuner.study.numerics_guard import compare
from tuner.workload import ClusterSpec, TrainSpec, Workload, workload_to_dict

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]
LLAMA = {**SP_LLAMA, "tie_word_embeddings": False}  # an untied head: AutoTP shards it (column-wise, gathered)
SEQ, SAMPLES = 64, 4
EXACT = 1e-6  # fp32: the same sums in another order


def run_spec(world: int, stage: int, tp: int = 1, nodes: int = 1, hpz: int = 1) -> RunSpec:
    workload = Workload(
        model_from_config(LLAMA, "tiny-llama"),
        ClusterSpec(gpus_per_node=world // nodes, nodes=nodes, device="cpu"),
        TrainSpec(seq_len=SEQ, precision="fp32"),
    )
    dp = world // tp
    zero = {"stage": stage, "reduce_bucket_size": 50_000, "stage3_param_persistence_threshold": 0}
    if hpz > 1:  # prefetch and reuse off: backward gathers from the secondary partition
        zero.update(zero_hpz_partition_size=hpz, stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0)
    ds_config = {
        "train_batch_size": SAMPLES,
        "train_micro_batch_size_per_gpu": SAMPLES // dp,
        "gradient_clipping": 0.0,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        **({"tensor_parallel": {"autotp_size": tp}} if tp > 1 else {}),
    }
    return RunSpec(
        workload_to_dict(workload), ds_config, device="cpu", warmup=1, steps=2, probe_memory=False,
        collective_timeout_s=900,  # a loaded machine starts a peer late: wait on it, not a clock
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict:
    """Six runs shared by the tests: one rank and TP 2 under ZeRO-2 and ZeRO-3 (ZeRO-3 builds the model
    partitioned, so it has its own reference), TP 2 × DP 2 under ZeRO-2, and ZeRO++ hpZ groups of 2 on 4 ranks
    as 2 nodes of 2 (``--nodes 2``)."""
    specs = {
        "one-z2": run_spec(1, 2),
        "tp-z2": run_spec(2, 2, tp=2),
        "tp-dp-z2": run_spec(4, 2, tp=2),
        "one-z3": run_spec(1, 3),
        "tp-z3": run_spec(2, 3, tp=2),
        "hpz-z3": run_spec(4, 3, nodes=2, hpz=2),
    }
    results = {name: launch_local(spec, timeout=900) for name, spec in specs.items()}
    for name, result in results.items():
        assert result.status == "ok", f"{name}: {result.error}"
    return results


@pytest.mark.parametrize(
    ("reference", "parallel"), [("one-z2", "tp-z2"), ("one-z2", "tp-dp-z2"), ("one-z3", "tp-z3"), ("one-z3", "hpz-z3")]
)
def test_tp_and_hpz_first_step_loss_and_grad_norm_equal_one_ranks(runs, reference: str, parallel: str) -> None:
    one = runs[reference].ranks[0].numerics
    assert one["step0_loss"] > 0 and one["step0_grad_norm"] > 0
    for rank in runs[parallel].ranks:
        assert rank.numerics["step0_loss"] == pytest.approx(one["step0_loss"], rel=EXACT)
        assert rank.numerics["step0_grad_norm"] == pytest.approx(one["step0_grad_norm"], rel=EXACT)
    assert not compare(runs[parallel].numerics, one, "fp32").diverged  # the study's numerics guard agrees


def test_tp_ranks_are_sharded_report_their_place_and_count_samples_once(runs) -> None:
    whole = runs["one-z2"].ranks[0].local_params
    assert whole == model_from_config(LLAMA, "tiny-llama").n_params
    for name in ("tp-z2", "tp-dp-z2", "tp-z3"):
        # attention, MLP and the head halved; embeddings and norms whole (0.58 × here)
        assert [rank.local_params for rank in runs[name].ranks] == [runs["tp-z2"].ranks[0].local_params] * len(
            runs[name].ranks
        )
    assert 0.5 < runs["tp-z2"].ranks[0].local_params / whole < 0.7
    places = [{k: rank.layout[k] for k in ("tensor_parallel", "tp_rank", "data_parallel", "dp_rank")}
              for rank in runs["tp-dp-z2"].ranks]  # fmt: skip
    assert places == [
        {"tensor_parallel": 2, "tp_rank": rank % 2, "data_parallel": 2, "dp_rank": rank // 2} for rank in range(4)
    ]
    for name in ("tp-z2", "tp-dp-z2"):  # 4 samples a step, not 4 × tp
        result = runs[name]
        assert result.samples_per_s == pytest.approx(SAMPLES / result.step_time_s["p50"])
