"""CPU-run estimates are exactly what they were before the CUDA terms (``data/cpu_estimates.json``, recorded from
the estimator without them: commit 2c61520, the true-peak transients in, the CUDA terms not yet): CUDA's context,
NCCL, cuBLAS, allocator and attention-kernel terms must add nothing on CPU ranks. Re-recorded once since, for the
24 ZeRO-3 multi-rank cases only, when the counting allocator showed that backward releases the parameters forward
kept gathered (``gathered_in_backward`` went), and for the 72 bf16 cases when the loss's backward was measured to hold
two fp32 logits-sized gradients (the logits workspace is ``max(e + 4, 8)·bsV``, was ``(e + 4)·bsV``: the counting
allocator's true peak of a bf16 Qwen2 at sequence 1024, ``bench/sp_true_peak.py``'s data-parallel row, −0.00 %;
the 24 rows of ``bench/estimator_true_peak.py`` re-scored unchanged), and for the 8 ZeRO-3 Llama-2-7B cases when what
forward keeps gathered followed ``stage3_max_reuse_distance`` instead of ``stage3_max_live_parameters`` (1e9 elements
kept before; now the 502,267,904 within the reuse distance of their backward use: the LM head and the last layers;
``bench/precision_true_peak.py``'s ZeRO-3 rows within 0.01 % of the counting allocator with it), and for the 36 bf16
ZeRO-1/2 cases without offload when the step was measured to hold the 16-bit gradient buffer beside the gradient
norm's fp64 slices and beside the flat partition's copy and cast (``gradient_copies``: that bench's seq-32 ZeRO-2
rows -16.8/-13.2 % -> within 0.01 %), for the 27 checkpointed cases at ZeRO-3 or with the optimizer offloaded when
backward's first recomputed layer was counted beside every other layer's checkpoint (``first_recompute_checkpoints``:
the counting allocator's true backward peak of a checkpointed transformers Llama rises one checkpoint per layer,
``bench/first_recompute.py``, -25.8 % -> -4.8 % at 16 layers), and for the 36 fp32 ZeRO-1/2 cases with optimizer
offload when backward's copy of the gradients to the host was measured to hold the fp64 copy of a gradient slice for
its norm (``offload_reduce``; the seq-32 offload rows -13.8/-15.4 % -> 0.00/+0.18 %), and for the 12 ZeRO-3
multi-rank cases without checkpointing when backward's start was measured to hold every parameter forward kept
gathered beside the LM head's gradients (``stage3_backward_start``; that bench's seq-32 ZeRO-3 rows -2.13/-4.40 % ->
-0.21/+0.03 %): the peak moved only for Llama-2-7B in fp32 with offload, whose head's weight gradient (524 MB) at
its backward outweighs the loss's workspace (262 MB at 4 × 256 tokens)."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.estimator import estimate
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

GOLDEN = json.loads((Path(__file__).parent / "data" / "cpu_estimates.json").read_text())


def configs() -> Iterator[tuple[str, dict]]:
    for stage in (0, 1, 2, 3):
        for micro, precision, overlap, offload in ((1, "bf16", True, "none"), (4, "fp32", False, "cpu")):
            zero: dict = {"stage": stage, "overlap_comm": overlap, "reduce_bucket_size": 50_000_000}
            if stage:
                zero["offload_optimizer"] = {"device": offload}
            config = {"train_micro_batch_size_per_gpu": micro, "zero_optimization": zero}
            if precision == "bf16":
                config["bf16"] = {"enabled": True}
            yield f"s{stage}-m{micro}-{precision}-{overlap}-{offload}", config


def cases() -> Iterator[tuple[str, Workload, bool, dict]]:
    for model in ("tiny-llama", "gpt2", "llama-2-7b"):
        for gpus, nodes in ((1, 1), (2, 1), (4, 2)):
            for checkpointing in (False, True):
                cluster = ClusterSpec(gpus_per_node=gpus, nodes=nodes, device="cpu")
                work = Workload(load_builtin_model(model), cluster, TrainSpec(seq_len=256))
                for name, config in configs():
                    yield f"{model}/{gpus}x{nodes}/{checkpointing}/{name}", work, checkpointing, config


@pytest.mark.parametrize("expandable", [False, True])
def test_cpu_estimates_are_unchanged(expandable: bool) -> None:
    seen = 0
    for key, work, checkpointing, config in cases():
        if expandable:  # an allocator setting for CUDA runs: nothing on CPU
            config = {**config, "dstune": {"expandable_segments": True}}
        est = estimate(work, TrialConfig(config, checkpointing))
        got = {"per_gpu": est.per_gpu, "cpu_per_node": est.cpu_per_node, "peak_phase": est.peak_phase}
        want = {name: GOLDEN[key][name] for name in got}
        assert got == want, key
        assert est.details == GOLDEN[key]["details"] and est.overhead_terms == {}, key
        seen += 1
    assert seen == len(GOLDEN) == 144
