"""The ``nn.MultiheadAttention`` transformer (``model_type: "mha_transformer"``) on 2 CPU ranks: the estimate against
the true peak, with DeepSpeedExamples' ``training/bf16_master_weight`` configs.

Truth: the true peak of live tensor bytes (the counting allocator, :mod:`tuner.measure.counting_allocator`, from
before the model is built to the end of the second step) of standalone gloo CPU ranks (:mod:`gloo_ranks`) training
dstune's built-in MHA transformer (:mod:`tuner.profile.mha_transformer`, the example's ``SimpleTransformerModel``)
small: 4 layers, hidden 128, 8 heads, vocabulary 4,096, seq 512, micro-batch 1, so that the attention weights
``need_weights`` materialises are a large part of the peak. The example's two configs at ZeRO-3 (its buckets scaled
to the model): ``baseline`` (fp32 master weights, no autocast) and ``bf16_full`` (bf16 master weights, gradients and
optimizer states, ``torch_autocast`` bf16: the forward pass and the loss under CPU autocast here), each with and
without activation checkpointing (each block checkpointed non-reentrantly, as the example's
``checkpoint(layer, x, use_reentrant=False)``). The ranks build the model under ``zero.Init``, whose memory-efficient
linear saves each weight itself; the example builds it outside, so torch's ``F.linear`` saves views that keep every
gathered weight until backward (:mod:`tuner.estimator.states.saved_weights`): the ``torch-linear`` rows run torch's own
``F.linear`` (``zero_optimization.memory_efficient_linear: false``); at seq 512 ZeRO-3 keeps this small model's
parameters gathered from forward to backward anyway, so the ``seq64-released`` rows (no reuse distance, every
module's parameters released after use, seq 64: the weights a larger part of the peak) show the held weights.

Run: ``python bench/mha_true_peak.py [--only KEY] [--remeasure]``; results in ``bench/results/mha_true_peak.json``
and ``.md`` (rendered with the current estimator).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gloo_ranks

SEQ, SHORT, MICRO, BUCKET = 512, 64, 1, 500_000
MODEL = {
    "model_type": "mha_transformer",
    "vocab_size": 4096,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "max_position_embeddings": SEQ,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": {"bf16": {"enabled": True}, "torch_autocast": {"enabled": False}},
    "bf16_full": {
        "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
        "torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"},
    },
}


def ds_config(case: dict[str, Any]) -> dict[str, Any]:
    """The example's config ``case["config"]`` at ZeRO-3, its buckets :data:`BUCKET` elements."""
    zero = {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": BUCKET,
        "stage3_param_persistence_threshold": 0,
    }
    if case.get("torch_linear"):  # torch's own F.linear, as in a script that builds its model outside zero.Init
        zero["memory_efficient_linear"] = False
    if case.get("release"):  # every module's parameters released after use: nothing kept gathered for backward
        zero.update(stage3_max_reuse_distance=0, stage3_max_live_parameters=BUCKET, stage3_prefetch_bucket_size=BUCKET)
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8}},
        "zero_optimization": zero,
        **CONFIGS[case["config"]],
    }


def cases() -> list[dict[str, Any]]:
    found = [{"config": name, "checkpointing": ckpt, "world": 2} for name in CONFIGS for ckpt in (False, True)]
    found += [{"config": name, "checkpointing": False, "world": 2, "torch_linear": True} for name in CONFIGS]
    short = {"checkpointing": False, "world": 2, "seq": SHORT, "release": True}  # the weights a sizeable part
    return found + [{**short, "config": name, "torch_linear": linear} for name in CONFIGS for linear in (False, True)]


def key(case: dict[str, Any]) -> str:
    linear = "/torch-linear" if case.get("torch_linear") else ""
    short = f"/seq{case['seq']}-released" if case.get("release") else ""
    return f"{case['config']}/{'checkpointing' if case['checkpointing'] else 'no-checkpointing'}{linear}{short}"


def rank_main(case: dict[str, Any], out: Path) -> None:
    """One rank of ``case``: build (checkpointing enabled where asked), initialise, two steps, write the report."""
    import torch

    from tuner.profile.hf import enable_checkpointing

    rank = gloo_ranks.join()

    def adapt(model: Any) -> None:
        if case["checkpointing"]:
            enable_checkpointing(model)

    engine, tracker = gloo_ranks.counted_engine(ds_config(case), MODEL, "MHA_BENCH_DETAIL", adapt=adapt, attention=None)
    seq = case.get("seq", SEQ)
    tokens = torch.randint(0, MODEL["vocab_size"], (MICRO, seq), generator=torch.Generator().manual_seed(rank))
    gloo_ranks.train_and_report(engine, tracker, lambda: engine(input_ids=tokens, labels=tokens).loss, out)


def row(case: dict[str, Any], case_key: str, data: dict[str, Any]) -> str:
    """One Markdown row: the estimate against the worst rank's true peak."""
    if data["status"] != "ok":
        return f"| {case_key} | {data['status']} | | | |"
    est = gloo_ranks.estimate_peak(
        MODEL, "mha", case["world"], case.get("seq", SEQ), ds_config(case), case["checkpointing"], attention="eager"
    )
    predicted = max(phase.gpu_total + phase.cpu_total for phase in est.phases.values())  # one process's memory
    worst = max(data["ranks"], key=lambda r: r["peak_bytes"])
    true = worst["peak_bytes"]
    return (
        f"| {case_key} | {predicted / 2**20:.2f} | {true / 2**20:.2f} | {predicted / true - 1:+.2%} | "
        f"{worst['peak_during']} ({est.peak_phase}) |"
    )


def main() -> None:
    args, measured = gloo_ranks.bench_args(__doc__, "mha_true_peak", rank_main, md=True)
    rows = [
        row(case, case_key, measured[case_key])
        for case, case_key, _ in gloo_ranks.measured_cases(
            cases(), key, lambda case: gloo_ranks.run_ranks(__file__, case, 1800), measured, args
        )
    ]
    for line in rows:
        print(line, flush=True)
    header = (
        "| case | estimate MiB | true peak MiB | error | true peak during (estimated phase) |\n|---|---|---|---|---|"
    )
    text = f"# The nn.MultiheadAttention transformer on 2 CPU ranks\n\n{__doc__.split(chr(10) * 2)[1]}\n\n"
    args.md.write_text(text + header + "\n" + "\n".join(rows) + "\n" + NOTES)


NOTES = """
Notes (measured 2 CPU ranks, gloo, torch 2.13.0+cpu, DeepSpeed 0.19.8):

* Without checkpointing the estimate is within 1 % of the true peak with either config: the traced layers (the
  attention weights ``need_weights`` materialises, the fp32 log-softmax under autocast) and the loss's workspace in
  the logits' dtype (:mod:`tuner.estimator.activations.plain_loss`; Hugging Face's fp32 formula over-counted it, +15 %).
* ``baseline/checkpointing`` is 14 % under (5.29 MiB): its true peak falls in the second step's forward pass, inside
  one checkpointed block's ``nn.MultiheadAttention``, when ``need_weights`` averages the attention weights over the
  heads. The allocation sites alive there (``MHA_BENCH_DETAIL=1``, rank 0): the 4 MiB softmax output, 9 MiB made by
  ``aten::mean`` (torch's CPU mean of a bf16 tensor sums in fp32: an 8 MiB fp32 copy of the ``[1, 8, 512, 512]``
  weights and a 1 MiB fp32 sum; ``a.mean(dim=1)`` alone peaks at 9.5 MiB), the 0.5 MiB averaged weights and the
  0.5 MiB checkpoints, beside the model states, among which a 3.65 MiB buffer the estimate does not hold: the flat
  output of ZeRO-3's coalesced all-gather (``_all_gather_dtype``), kept by its handle until the last parameter of
  the bucket is used, here every forward layer (the prefetch bucket holds the whole model), beside the 3.65 MiB of
  gathered parameters copied out of it. Of the 5.29 MiB: 3.65 MiB that buffer, 1.64 MiB the block's forward working
  set (14.00 MiB counted around one ``checkpoint(block, x)`` alone, 28.00 at micro-batch 2) beyond the loss moment's
  12.63 MiB. The traced profile sees ops, not what a kernel allocates inside: the same block's forward traced op by
  op peaks at 8.5 MiB, the mean's fp32 temporaries unseen. ``bf16_full/checkpointing`` (its peak in backward, the
  recomputed block) agrees to 0.05 %.
* At seq 512 with the example's ZeRO-3 settings this small model's parameters all stay gathered from forward to
  backward (``stage3_max_live_parameters`` and ``stage3_max_reuse_distance`` are 1e9), so torch's ``F.linear``
  holds nothing more: the ``torch-linear`` rows measure the same peaks, as estimated. Where every module's
  parameters are released after use (``seq64-released``), torch's ``F.linear`` raises the true peak by 1.30 MiB
  (fp32 master) and 1.13 MiB (bf16 master), the estimate by 2.63 MiB (every Linear's bf16 weight, 1.31M
  elements): at its peak the real run holds about half of them; the estimate, all (+2.9 % and +6.4 %).
"""


if __name__ == "__main__":
    main()
