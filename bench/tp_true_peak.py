"""The estimate against the true peak of live tensor bytes under AutoTP tensor parallelism, per rank, on CPU ranks.

Truth: the counting allocator (:mod:`tuner.measure.rank.counting_allocator`, live CPU tensor bytes counted at torch's
CPU allocator on every thread), from before the model is built to the end of the second training step, on gloo CPU
ranks started by this script. The ranks are standalone (the runner's path is not used): a tiny LLaMA built by
transformers with random weights in bf16, ``deepspeed.initialize`` with ``tensor_parallel.autotp_size`` (DeepSpeed
0.19.8 applies AutoTP inside the engine, from the model's ``tp_plan``), each tensor-parallel group fed the same batch
(``dp_rank = rank // tp``), two steps. Small buckets, seq 1024, micro-batch 1, so activations are most of the peak.

Run: ``python bench/tp_true_peak.py [--only KEY] [--remeasure]``; results in ``bench/results/tp_true_peak.json``
(``TP_BENCH_DETAIL=stack`` records the allocation sites alive at the peak). Measured 2026-12 (DeepSpeed 0.19.8,
torch 2.13 CPU, 2 shared cores): the nine AutoTP rows within 0.01 % of the true peak, after ZeRO-3's partitioning
of AutoTP's replicated parameters over all ranks was found from the allocation sites (it was 4.3 % high before);
ZeRO-3 on 4 ranks -0.06 %, with hpZ = 2 +0.66 % (the same true peak: no secondary partition alive at it).

A LayerNorm model with biases (a tiny Phi: biased q, k, v, dense, fc1, fc2 and LM head, parallel attention and MLP,
partial rotary), measured 2026-12-03: data-parallel +0.01 %; with AutoTP 2 the shapes' heuristic (biases whole, the
head not found behind its bias) gave each rank 1,252,352 elements where DeepSpeed holds 987,264, +7.3 % (ZeRO-2) and
+3.6 % (ZeRO-3). The profile now reads AutoTP's split from the model's tp_plan as DeepSpeed does
(:mod:`tuner.profile.tp_plan`: column-parallel weights with their biases): 987,264 elements, +2.2 % at ZeRO-2 and 3.
The rest (tp 1 is exact) is not taken apart: not the LayerNorm term (the estimate keeps two norms per layer whole
where Phi has one, but even no whole part could take only 1.0 of the 1.5 MiB off the rank).

An MoE (tiny Qwen2-MoE), measured 2026-12-03 with transformers 5.25: its tp_plan now shards the attention only
(5.24's carried `moe_tp_experts` and `packed_colwise`, which DeepSpeed refuses), and DeepSpeed trains it with the
experts and the shared expert whole on every rank, both ranks' losses equal. With the plan read into the profile and
the MoE block's saved tensors (traced) kept whole: ZeRO-2 and 3, TP 2 and TP 2 × DP 2, each +0.01 %, the rank's
1,329,280 elements exact. ZeRO-3 on 4 ranks without and with hpZ = 2: -0.73 / +0.29 % (the same true peak, as the
LLaMA's: no secondary partition alive at it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gloo_ranks

SEQ, MICRO, BUCKET = 1024, 1, 500_000
LLAMA = {
    "model_type": "llama",
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
WIDE = {**LLAMA, "vocab_size": 512, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4}
PHI = {  # LayerNorm with biases, biased Linears (the LM head's too), a GELU MLP beside attention, partial rotary
    "model_type": "phi",
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "partial_rotary_factor": 0.5,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
QWEN2_MOE = gloo_ranks.TINY_QWEN2_MOE
MODELS = {
    "llama": LLAMA,
    "wide": WIDE,
    "phi": PHI,
    "qwen2-moe": QWEN2_MOE,
}  # wide: the layers' activations, not the logits, are most of it


def ds_config(stage: int, tp: int, hpz: int = 1) -> dict[str, Any]:
    """bf16, ZeRO ``stage``, small buckets, AutoTP degree ``tp``, hpZ groups of ``hpz`` ranks."""
    zero = {"zero_hpz_partition_size": hpz} if hpz > 1 else {}
    return {**gloo_ranks.small_bucket_config(stage, MICRO, BUCKET, **zero), "tensor_parallel": {"autotp_size": tp}}


def cases() -> list[dict[str, Any]]:
    """The dense models at ZeRO-2 on 2 ranks, data parallel (the reference) and AutoTP = 2; the tiny LLaMA at ZeRO-1
    and ZeRO-3 with AutoTP = 2, and TP 2 × DP 2 on 4 ranks at ZeRO-2 and 3; ZeRO-3 on 4 ranks without and with hpZ
    groups of 2; the wide one and Phi at ZeRO-3 with AutoTP = 2; the MoE at ZeRO-2 (DP and TP 2), ZeRO-3 with TP 2,
    TP 2 × DP 2, and ZeRO-3 on 4 ranks without and with hpZ groups of 2."""
    found = [{"model": name, "stage": 2, "world": 2, "tp": tp} for name in ("llama", "wide", "phi") for tp in (1, 2)]
    found += [{"model": "llama", "stage": stage, "world": 2, "tp": 2} for stage in (1, 3)]
    found += [{"model": "llama", "stage": stage, "world": 4, "tp": 2} for stage in (2, 3)]
    found += [{"model": "llama", "stage": 3, "world": 4, "tp": 1, "hpz": hpz} for hpz in (1, 2)]
    found.append({"model": "wide", "stage": 3, "world": 2, "tp": 2})
    found.append({"model": "phi", "stage": 3, "world": 2, "tp": 2})
    found += [{"model": "qwen2-moe", "stage": 2, "world": 2, "tp": tp} for tp in (1, 2)]
    return [
        *found,
        {"model": "qwen2-moe", "stage": 3, "world": 2, "tp": 2},
        {"model": "qwen2-moe", "stage": 2, "world": 4, "tp": 2},
        {"model": "qwen2-moe", "stage": 3, "world": 4, "tp": 1},
        {"model": "qwen2-moe", "stage": 3, "world": 4, "tp": 1, "hpz": 2},
    ]


def key(case: dict[str, Any]) -> str:
    hpz = f"/hpz{case['hpz']}" if case.get("hpz", 1) > 1 else ""
    return f"{case['model']}/z{case['stage']}/w{case['world']}/tp{case['tp']}{hpz}"


def rank_main(case: dict[str, Any], out: Path) -> None:
    """One rank of ``case``: build, initialise (AutoTP inside), two steps, write the counted peak."""
    import torch

    rank, tp = gloo_ranks.join(), case["tp"]
    ds = ds_config(case["stage"], tp, case.get("hpz", 1))
    engine, tracker = gloo_ranks.counted_engine(ds, MODELS[case["model"]], "TP_BENCH_DETAIL")
    dp_rank = rank // tp
    vocab = MODELS[case["model"]]["vocab_size"]
    tokens = torch.randint(0, vocab, (MICRO, SEQ), generator=torch.Generator().manual_seed(dp_rank))
    params = engine.module.named_parameters()
    shapes = {name: list(getattr(p, "ds_shape", p.shape)) for name, p in params if "layers.0." in name}
    local = sum(p.numel() for p in engine.module.parameters())
    shards = sum(p.ds_tensor.numel() for p in engine.module.parameters() if hasattr(p, "ds_tensor"))
    extra = {"layer0_shapes": shapes, "local_elements": local, "zero3_shard_elements": shards}
    gloo_ranks.train_and_report(engine, tracker, lambda: engine(input_ids=tokens, labels=tokens).loss, out, extra)


def measure(case: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Start the case's ranks (gloo, one thread each) and collect their reports (:func:`gloo_ranks.run_ranks`)."""
    return gloo_ranks.run_ranks(__file__, case, timeout)


def estimate_case(case: dict[str, Any]) -> Any:
    """dstune's estimate of ``case`` (the workload carries the model's traced profile at ``SEQ``)."""
    config = ds_config(case["stage"], case["tp"], case.get("hpz", 1))
    return gloo_ranks.estimate_peak(MODELS[case["model"]], case["model"], case["world"], SEQ, config)


def main() -> None:
    args, measured = gloo_ranks.bench_args(__doc__, "tp_true_peak", rank_main)
    for case, case_key, _ in gloo_ranks.measured_cases(cases(), key, measure, measured, args):
        data = measured[case_key]
        if data["status"] != "ok":
            print(case_key, "error", data["error"][-2000:], flush=True)
            continue
        est = estimate_case(case)
        true = max(r["peak_bytes"] for r in data["ranks"])
        worst = max(data["ranks"], key=lambda r: r["peak_bytes"])
        local = est.details.get("tp_local_elements", est.n_params)
        saved = est.phases["forward"].gpu["activations"] / 2**20
        print(
            f"{case_key}: estimate {est.per_gpu['total'] / 2**20:.2f} MiB, true peak {true / 2**20:.2f} MiB "
            f"({est.per_gpu['total'] / true - 1:+.2%}), peak during {worst.get('peak_during')} "
            f"(estimated {est.peak_phase}; saved activations {saved:.2f} MiB), "
            f"losses {[r['losses'] for r in data['ranks']]}, "
            f"local elements {[r['local_elements'] for r in data['ranks']]} (estimate {local}), "
            f"{data['wall_s']:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
