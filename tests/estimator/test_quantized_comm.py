"""ZeRO++'s qwZ and qgZ (``tuner/estimator/layouts/zeropp.py``): estimate only (DeepSpeed's quantizer needs CUDA), so
checked here against volumes and buffers derived by hand from DeepSpeed 0.19.8's code, on LLaMA-2-7B over 2 nodes of
8 H100s, ZeRO-3 with every parameter gathered (persistence threshold 0) and no overlap."""

import pytest

from tuner.estimator import estimate, predict
from tuner.estimator.layouts.zeropp import qgz_reduce_transient, qwz_staging_bytes
from tuner.estimator.throughput.hardware import TABLE
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

MODEL = load_builtin_model("llama-2-7b")
TWO_NODES = Workload(MODEL, ClusterSpec(gpus_per_node=8, nodes=2), TrainSpec(seq_len=2048))
PLAIN = {"stage3_param_persistence_threshold": 0, "overlap_comm": False}
INT8 = 1 + 4 / 8000  # bytes per gathered element: int8 and one fp32 scale per group of 8,000


def config(accum: int = 2, **zero: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, **PLAIN, **zero},
    }


def test_qwz_gathers_int8_and_qgz_reduces_int4_within_then_across_the_nodes() -> None:
    """Per micro-step: two gathers (forward, backward) and one gradient reduction. 16-bit: each ``15/16 × 2Ψ``
    bytes across the nodes. qwZ: the gathers move ``15/16 × 1.0005Ψ``. qgZ: ``7/8 × Ψ/2`` bytes within the node, then
    ``1/2 × Ψ/16`` across, replacing the reduce-scatter, and four all-to-all calls per gradient tensor."""
    hw, psi = TABLE["H100"], MODEL.n_params
    across = 15 / 16 * 2 * psi / hw.inter_bw
    plain = predict(TWO_NODES, config())
    assert plain.terms.bandwidth == pytest.approx(2 * 3 * across)
    qwz = predict(TWO_NODES, config(zero_quantized_weights=True))
    assert qwz.terms.bandwidth == pytest.approx(2 * (2 * across * INT8 / 2 + across))
    qgz = predict(TWO_NODES, config(zero_quantized_gradients=True))
    reduction = 7 / 8 * psi / 2 / hw.intra_bw + 1 / 2 * psi / 2 / 8 / hw.inter_bw
    assert qgz.terms.bandwidth == pytest.approx(2 * (2 * across + reduction))
    both = predict(TWO_NODES, config(zero_quantized_weights=True, zero_quantized_gradients=True))
    assert both.tokens_per_s > max(qwz.tokens_per_s, qgz.tokens_per_s) > plain.tokens_per_s
    tensors = len(MODEL.param_numels)
    assert qgz.terms.latency - plain.terms.latency == pytest.approx(
        2 * (4 * tensors - -(-psi // 500_000_000)) * hw.collective_s
    )


def test_qwz_stages_the_gathered_set_in_int8_and_qgz_reduces_one_tensor_at_a_time() -> None:
    """qwZ: the set being gathered (the largest parameter and the prefetch bucket) arrives in an int8 buffer with
    its scales. qgZ: the largest gradient's int4 copies, their reduced halves and the fp16 result, beside the full
    gradient, instead of the padded bucket's flat staging."""
    work = Workload(MODEL, ClusterSpec(gpus_per_node=8, nodes=2), TrainSpec(seq_len=2048))
    largest = max(MODEL.param_numels)
    plain = estimate(work, config(accum=1))
    qwz = estimate(work, config(accum=1, zero_quantized_weights=True))
    gathering = largest + 50_000_000  # the embedding and DeepSpeed's default stage3_prefetch_bucket_size
    assert qwz.details["qwz_staging"] == qwz_staging_bytes(gathering) == round(gathering * INT8)
    assert qwz.phases["forward"].gpu["buffers"] - plain.phases["forward"].gpu["buffers"] == qwz.details["qwz_staging"]
    qgz = estimate(work, config(accum=1, zero_quantized_gradients=True))
    assert qgz.details["reduce_copy"] == qgz_reduce_transient(largest, 8) + 2 * largest
    assert qgz.details["reduce_copy"] < plain.details["reduce_copy"]
