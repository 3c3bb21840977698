"""The estimate under AutoTP against the true peak of a real DeepSpeed run (slow): 2 gloo CPU ranks at tp = 2,
ZeRO-3, bf16, a tiny LLaMA at seq 1024, trained by ``bench/tp_true_peak.py``'s ranks (DeepSpeed 0.19.8 applies
AutoTP inside ``deepspeed.initialize``). Truth: the counting allocator's peak of live CPU tensor bytes (every
thread), not the estimator's own arithmetic."""

from __future__ import annotations

import pytest
from bench_module import load_bench

CASE = {"model": "llama", "stage": 3, "world": 2, "tp": 2}


@pytest.mark.slow
def test_autotp_estimate_is_within_3_percent_of_the_true_peak() -> None:
    bench = load_bench("tp_true_peak")
    data = bench.measure(CASE, timeout=1800)
    assert data["status"] == "ok", data["error"]
    ranks = data["ranks"]
    assert ranks[0]["losses"] == ranks[1]["losses"]  # one tensor-parallel group, one batch
    assert ranks[0]["layer0_shapes"]["model.layers.0.self_attn.q_proj.weight"] == [64, 128]  # sharded by heads
    est = bench.estimate_case(CASE)
    assert est.per_gpu["total"] == pytest.approx(max(r["peak_bytes"] for r in ranks), rel=0.03)
    assert ranks[0]["zero3_shard_elements"] == est.details["partition_elements"]


PHI = {"model": "phi", "stage": 2, "world": 2, "tp": 2}
MOE = {"model": "qwen2-moe", "stage": 2, "world": 2, "tp": 2}


@pytest.mark.slow
@pytest.mark.parametrize("case", [PHI, MOE], ids=["phi", "moe"])
def test_a_rank_holds_what_the_models_tp_plan_shards(case: dict) -> None:
    """Phi (LayerNorm, biased Linears and LM head): the column-parallel biases and the head go with their weights;
    the shapes' heuristic (biases whole, the biased head not found) was 7.3 % over. Qwen2-MoE (transformers 5.25's
    plan: attention only): the experts and their block's activations stay whole. The rank holds what the estimate
    gives it to the element, and the peak is within 3 %."""
    bench = load_bench("tp_true_peak")
    data = bench.measure(case, timeout=1800)
    assert data["status"] == "ok", data["error"]
    ranks = data["ranks"]
    assert ranks[0]["losses"] == ranks[1]["losses"]  # one tensor-parallel group, one batch
    est = bench.estimate_case(case)
    assert {r["local_elements"] for r in ranks} == {est.details["tp_local_elements"]}
    assert est.per_gpu["total"] == pytest.approx(max(r["peak_bytes"] for r in ranks), rel=0.03)
