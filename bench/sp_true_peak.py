"""The estimate against the true peak of live tensor bytes under Ulysses sequence parallelism, per rank, on CPU ranks.

Truth: the counting allocator (:mod:`tuner.measure.rank.counting_allocator`, live CPU tensor bytes counted at torch's
CPU allocator on every thread), from before the model is built to the end of the second training step, on gloo CPU
ranks started by this script. The runner does not train with Ulysses yet, so the ranks here are standalone: DeepSpeed
0.19.8's ``UlyssesSPAttentionHF.register_with_transformers`` (sdpa) with its mpu passed to ``deepspeed.initialize``,
the batch split along the sequence by hand as ``UlyssesSPDataLoaderAdapter`` splits it (input ids, position ids and
the pre-shifted labels, each rank its ``s/sp`` tokens), DeepSpeed's ``TiledMLP`` around each decoder layer's MLP block
and ``TiledFusedLogitsLoss`` over the LM head when asked. Each rank backpropagates its own mean loss (memory does not
depend on how the shares are averaged).

Models: a tiny Qwen2 (dense, grouped-query heads) and a tiny Qwen2-MoE (4 experts, shared expert), built by
transformers with random weights in bf16 (:mod:`tuner.measure.rank.birth`: sharded under ZeRO-3's ``zero.Init``),
seq 1024, micro-batch 1, small buckets so that activations are most of the peak.

Measurements are kept in ``bench/results/sp_true_peak.json``; the table is rendered with the current estimator.
Run: ``python bench/sp_true_peak.py [--only KEY] [--remeasure] [--render]`` (a few minutes per row on 2 shared cores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gloo_ranks

SEQ, MICRO = 1024, 1
QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
QWEN2_MOE = gloo_ranks.TINY_QWEN2_MOE
MODELS = {"qwen2": QWEN2, "qwen2-moe": QWEN2_MOE}
BUCKET = 500_000


def model_config(case: dict[str, Any]) -> dict[str, Any]:
    """The case's model config, its positions extended to the case's sequence when longer than the default."""
    config = dict(MODELS[case["model"]])
    config["max_position_embeddings"] = max(config["max_position_embeddings"], case.get("seq", SEQ))
    return config


def ds_config(stage: int, sp: int, mlp: int, loss: int, bucket: int = BUCKET, accum: int = 1) -> dict[str, Any]:
    """bf16, ZeRO ``stage``, small buckets, Ulysses degree ``sp``, the tiling in dstune's section, ``accum``
    micro-steps per optimizer step."""
    config = {**gloo_ranks.small_bucket_config(stage, MICRO, bucket), "sequence_parallel_size": sp}
    config["gradient_accumulation_steps"] = accum
    if mlp > 1 or loss > 1:
        config["dstune"] = {"tiled_mlp_shards": mlp, "tiled_loss_shards": loss}
    return config


def cases() -> list[dict[str, Any]]:
    """The rows: both models, ZeRO 2 and 3, SP=2 on 2 ranks with and without tiling, the DP=2 baseline, and SP=2 ×
    DP=2 on 4 ranks with and without tiling."""
    found = []
    for name in MODELS:
        for stage in (2, 3):
            found.append({"model": name, "stage": stage, "world": 2, "sp": 1, "mlp": 1, "loss": 1})
            found.append({"model": name, "stage": stage, "world": 2, "sp": 2, "mlp": 1, "loss": 1})
            found.append({"model": name, "stage": stage, "world": 2, "sp": 2, "mlp": 4, "loss": 4})
            found.append({"model": name, "stage": stage, "world": 4, "sp": 2, "mlp": 1, "loss": 1})
            found.append({"model": name, "stage": stage, "world": 4, "sp": 2, "mlp": 4, "loss": 4})
    # the tiled loss's LM-head gradient (4096 x 128 = 524,288 elements) fitting a 1e6-element ZeRO-2 bucket: copied
    # into it in forward, where the 5e5 bucket leaves it a tensor of its own
    found.append({"model": "qwen2", "stage": 2, "world": 2, "sp": 2, "mlp": 4, "loss": 4, "bucket": 1_000_000})
    # activation checkpointing, as ALST trains: the peak moves into a recomputed layer's backward
    for stage in (2, 3):
        for tiles in (1, 4):
            found.append(
                {"model": "qwen2", "stage": stage, "world": 2, "sp": 2, "mlp": tiles, "loss": tiles, "ckpt": True}
            )
    # a long sequence, where a recomputed layer (not the logits) sets the peak: ZeRO 0, 2 and 3
    for stage in (0, 2, 3):
        found.append(
            {"model": "qwen2", "stage": stage, "world": 2, "sp": 2, "mlp": 4, "loss": 16, "ckpt": True, "seq": 8192}
        )
    # the same without checkpointing (the MoE model too): the first layer's backward on top of every saved tensor
    for name in MODELS:
        found.append({"model": name, "stage": 3, "world": 2, "sp": 2, "mlp": 4, "loss": 16, "seq": 8192})
    # a MoE model's recomputed layer
    found.append(
        {"model": "qwen2-moe", "stage": 3, "world": 2, "sp": 2, "mlp": 4, "loss": 16, "ckpt": True, "seq": 8192}
    )
    return found + accumulation_cases()


def accumulation_cases() -> list[dict[str, Any]]:
    """Gradient accumulation (the second table): every micro-step after a step's first holds what the earlier ones
    accumulated."""
    found = []
    for stage in (2, 3):
        for tiles in (1, 4):
            found.append(
                {"model": "qwen2", "stage": stage, "world": 2, "sp": 2, "mlp": tiles, "loss": tiles, "accum": 2}
            )
    found.append({"model": "qwen2", "stage": 2, "world": 2, "sp": 1, "mlp": 1, "loss": 1, "accum": 2})
    found.append({"model": "qwen2", "stage": 2, "world": 2, "sp": 2, "mlp": 4, "loss": 4, "accum": 4})
    for stage in (0, 1):  # with the same without accumulation (not in the first table) beside them
        for accum in (1, 2):
            found.append({"model": "qwen2", "stage": stage, "world": 2, "sp": 2, "mlp": 4, "loss": 4, "accum": accum})
    return found


def key(case: dict[str, Any]) -> str:
    bucket = f"/b{case['bucket']}" if case.get("bucket", BUCKET) != BUCKET else ""
    ckpt = ("/ckpt" if case.get("ckpt") else "") + (f"/s{case['seq']}" if case.get("seq", SEQ) != SEQ else "")
    ckpt += f"/acc{case['accum']}" if case.get("accum", 1) != 1 else ""
    return (
        f"{case['model']}/z{case['stage']}/w{case['world']}/sp{case['sp']}/mlp{case['mlp']}/loss{case['loss']}{bucket}"
        + ckpt
    )


# ---------------------------------------------------------------------------------------------------------- ranks
class _Loss:
    """The training call: the model's own loss, or ``TiledFusedLogitsLoss`` over the LM head in ``shards``."""

    def __init__(self, shards: int) -> None:
        self.shards = shards

    def __call__(self, model: Any, ids: Any, positions: Any, labels: Any) -> Any:
        if self.shards == 1:
            return model(input_ids=ids, position_ids=positions, labels=labels, shift_labels=labels).loss
        import torch.nn.functional as F
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

        hidden = model.model(input_ids=ids, position_ids=positions).last_hidden_state

        def loss_fn(head: Any, x: Any, y: Any) -> Any:
            logits = head(x).float()
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))

        head = model.lm_head
        return TiledFusedLogitsLoss.apply(loss_fn, head, hidden, labels, None, self.shards, [head.weight], "mean")


def rank_main(case: dict[str, Any], out: Path) -> None:
    """One rank of ``case``: register Ulysses, build, initialise, two steps, write the counted peak."""
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    from tuner.profile.hf import hf_config

    rank, sp, seq = gloo_ranks.join(), case["sp"], case.get("seq", SEQ)
    config = model_config(case)
    ds = ds_config(case["stage"], sp, case["mlp"], case["loss"], case.get("bucket", BUCKET), case.get("accum", 1))
    mpu = None
    if sp > 1:
        holder = type("Holder", (), {"config": hf_config(config)})()
        mpu = UlyssesSPAttentionHF.register_with_transformers(holder, "sdpa", sp, MICRO, seq, False)

    def adapt(model: Any) -> None:
        if case.get("ckpt"):
            from tuner.profile.hf import enable_checkpointing

            model.train()
            enable_checkpointing(model)
        if case["mlp"] > 1:
            from tuner.measure.rank.layouts.alst import tile_mlps  # the runner's own tiling

            tile_mlps(model, case["mlp"])

    engine, tracker = gloo_ranks.counted_engine(ds, config, "SP_BENCH_DETAIL", mpu=mpu, adapt=adapt)
    sp_rank, dp_rank = rank % sp, rank // sp
    tokens = torch.randint(0, config["vocab_size"], (MICRO, seq + 1), generator=torch.Generator().manual_seed(dp_rank))
    chunk = slice(sp_rank * seq // sp, (sp_rank + 1) * seq // sp)
    ids, labels = tokens[:, :-1][:, chunk].contiguous(), tokens[:, 1:][:, chunk].contiguous()
    positions = torch.arange(seq).unsqueeze(0)[:, chunk].contiguous()
    compute = _Loss(case["loss"])

    def loss() -> Any:
        if case["loss"] > 1:
            return compute(engine.module, ids, positions, labels)
        return engine(input_ids=ids, position_ids=positions, labels=labels, shift_labels=labels).loss

    gloo_ranks.train_and_report(engine, tracker, loss, out, accumulation=case.get("accum", 1))


def measure(case: dict[str, Any], timeout: float = 3000) -> dict[str, Any]:
    """Start the case's ranks (gloo, one thread each) and collect their reports (:func:`gloo_ranks.run_ranks`)."""
    return gloo_ranks.run_ranks(__file__, case, timeout)


# -------------------------------------------------------------------------------------------------------- estimate
def estimate_case(case: dict[str, Any]) -> Any:
    """dstune's estimate of ``case`` (the workload carries the model's traced profile at the case's sequence)."""
    config = ds_config(
        case["stage"], case["sp"], case["mlp"], case["loss"], case.get("bucket", BUCKET), case.get("accum", 1)
    )
    seq = case.get("seq", SEQ)
    return gloo_ranks.estimate_peak(
        model_config(case), case["model"], case["world"], seq, config, bool(case.get("ckpt"))
    )


NOTES = """
Measured 2026-12-02 and -03 on 2 shared AVX2 cores (DeepSpeed 0.19.8, torch 2.13 CPU, transformers 5.24), FusedAdam,
buckets of 5e5 elements unless the row says otherwise. At sequence 1024 the untiled peak is the loss's backward: the
saved activations plus two fp32 logits-sized gradients (8·bsV), the estimator's logits workspace.

Under Ulysses every layer saves one [s/sp, q·d] tensor more than the plain model traced at s/sp: the output
projection's input. In the plain model it is the attention kernel's own output (its [b, s, heads, d] layout makes
HF's transpose a view), which the kernel saves too: one storage. Ulysses gathers the output back with an all-to-all
and reshapes it into a new one. Found on 2026-12-03 by listing the storages alive after the forward pass by the op
that made them (a dispatch mode in a temporary copy of this bench), with and without Ulysses at the same 4,096 tokens
a rank: 28.83 against 26.77 MiB, the difference two `aten::clone` [4096, 1, 2, 64] tensors, one per layer
(`long_context.attention_output_bytes`). Every untiled SP row was under by 0.6 to 1.9 % before; now the dense and
ZeRO-2 rows are within 0.13 %, the ZeRO-3 MoE ones -1.1 / -1.3 % (the MoE data-parallel baseline is -0.7 %).

ALST's tiled loss, taken apart with the counter's live bytes at marks inside `TiledFusedLogitsLoss`'s shard
function (each probe reproduced its row's stored peak to the byte; `tuner/estimator/tiled_loss.py`):
- the peak is inside a shard's backward with three fp32 shard-logits tensors (log-softmax's output,
  `nll_loss_backward`'s, `_log_softmax_backward_data`'s): 12 B per shard element, the 16-bit logits already freed;
- the LM head's weight gradient accumulates across the shards in a tensor of its own at every stage: DeepSpeed is told
  it is not ready (`ds_grad_is_ready = False`) until the last shard, whose hook copies it into a bucket after that
  shard's peak. It used to be counted only when the head did not fit ZeRO-2's bucket; the 1e6-bucket row (head fits)
  was -1.48 % then only because the bucket was counted in fp32;
- ZeRO-2's buckets are allocated there by the head's first hook in bf16 (`_gradient_reduction_buffer_dtype`): Ulysses'
  fp32 comes with the reduction, in backward;
- under ZeRO-3 no parameter is whole at that moment: the counter shows every `param.data` empty from the end of the
  model's forward on, persistent ones included (DeepSpeed releases them as the layers finish: 0.75 MiB whole at the
  step's start, 0 after the last layer). The forward phase is the larger of the loss's moment and a layer's (with
  its whole parameters), not their sum (`tiled_loss.whole_parameters_apart`).

A tiled MLP drops what the MLP block saved. The formula (`long_context.mlp_saved_bytes`) missed 820 B per token a
layer of Qwen2-MoE's block (4,438 traced against 3,618: the routed outputs the routing weights scale, the shared
expert's output its gate scales): the tiled ZeRO-3 MoE rows were over by 4.5 % (2 ranks) and 6.0 % (4 ranks). The
profile now traces it (`working_sets.layer_backward_peaks`: what the block made in its forward and still held when
backward starts; equal to the allocator's bytes left by the real block's forward, `tests/profile/test_working_sets.py`),
the formula only where the trace is missing. The MoE rows with the tiled MLP run since 2026-12-03: DeepSpeed's
`TiledMLP` hands the block its shards flattened to [tokens, hidden] in backward, which transformers' sparse-MoE
blocks cannot take; the runner's `tile_mlps` (which this bench uses) gives them the batch dimension back.

Activation checkpointing, as ALST trains: at sequence 8192 with tiling (MLP 4, loss 16) a recomputed layer, not the
logits, sets the peak: part-way through its backward, RMSNorm's gradient in fp32 (five fp32 [s/sp, h] temporaries)
beside what is left of its saved tensors. Counting the layer's saved bytes alone the estimate was under by 6.7 to 12.2
%; the profile traces that moment (`tuner/profile/working_sets.py`: the layer run alone under fake tensors; the same
layer run for real gives the allocator's figure to the byte). A bucket's reduction happens in a gradient hook,
between autograd ops, never at the layer's worst moment, inside one: the backward phase holds the larger of the two
(`activation_phases._recompute_beside_staging`; counting both was +8.3 % at ZeRO-3). The two ranks of the ZeRO-2 row
differ by 1.4 MiB (35.7 and 37.1 MiB; the table takes the larger). The MoE row with checkpointing was -35.5 %:
transformers' Qwen2-MoE builds a sliding-window mask (window 0, used by no layer) of (s/sp)^2 booleans, three such
tensors at once while building it (48 MiB at 4,096 tokens a rank); the profile keeps the forward pass's worst moment
before the first layer (`pre_layer_bytes`, checked against the allocator of the same forward run for real).

History of the worst row: 14.2 % (tiled ZeRO-2, before the head's gradient in forward), 35.5 % (MoE mask), 12.2 %
(recomputed layer), 8.3 % (staging beside it), 5.96 % (tiled ZeRO-3 MoE), 1.34 %, now 2.19 %: ZeRO-3 keeps gathered
after forward what backward reuses within `stage3_max_reuse_distance`, not capped at `stage3_max_live_parameters`
(these rows' 5e5), which DeepSpeed uses for the prefetch only (`bench/results/precision_true_peak.md`). The
untiled ZeRO-3 rows moved to within 0.02 % (were -0.06 to -1.28 %); the two tiled MoE rows at 8192, whose forward
moment holds the kept parameters beside the tiled loss, moved from -0.26 % and +1.34 % to +0.58 % and +2.19 % (not
analysed yet).
"""


ACCUMULATION_NOTES = """
Measured 2026-12-06 on 2 shared cores, as above, each step of `accumulation` micro-steps (DeepSpeed's
`gradient_accumulation_steps`; the bench's ranks call `engine.backward` and `engine.step` once per micro-step), the
peak over two optimizer steps. ZeRO-2 keeps what the earlier micro-steps reduced in `grads_in_partition` (the
gradients of the parameters its partition holds, whole where one straddles the boundary, in the training dtype: the
accumulation dtype must be it, `tuner/estimator/settings.py`) until the step: a later micro-step's forward holds it
beside its own activations. With the tiled loss the peak is there, at the loss's moment inside forward, and the
estimate was 5.9 % under (22.68 against 24.10 MiB); untiled, the start of the loss's backward (the estimate's
forward phase) holds it too (41.60 against 43.02 MiB, -3.3 %). `flat_states.accumulated` counts it in the forward
phase from two micro-steps on; four hold what two do. ZeRO-0 and ZeRO-1 reduce at the step only: a later
micro-step's forward holds every 16-bit gradient (the tiled loss's head gradient among them: it accumulates into
the head's own), ZeRO-1 -7.2 % before (22.68 against 24.44 MiB), ZeRO-0 31.74 against 31.75 MiB in that forward
now. ZeRO-3 measured the same with accumulation as without (its gradient partition is held from the first step on
and already counted). The runner's own count agrees: `dstune measure --model tiny-llama --gpus 2 --device cpu
--seq-len 1024 --sequence-parallel 2 --tiled-mlp 4 --tiled-loss 4 --grad-accum 2` at ZeRO-2 with 5e5-element
buckets peaked at 17.99 MiB, estimated 17.96 (16.99 before, -5.6 %).

The ZeRO-0 rows were under by 11 % with and without accumulation, at the step of the second rank only (rank 0
33.04 MiB, the estimate's figure then): FP16_Optimizer's gradient norm under Ulysses' mpu masks, on a
model-parallel rank above 0, the parameters it counts as duplicates (all of them; `deepspeed/runtime/utils.py`,
`get_flattened_grad_norm`: a zeros tensor, its cumsum and their bool over the flat fp32 gradient's n + 1 elements,
9 B an element at once, the 16-bit gradients already released), found with the counter's allocation sites at that
rank's peak (`SP_BENCH_DETAIL=ops`); `flat_states._masked_norm` counts it.
"""


def _rows(
    measured: dict[str, dict[str, Any]], found: list[dict[str, Any]], accum: bool
) -> tuple[list[str], list[float]]:
    """Each measured case's table row (with its accumulation steps where ``accum``) and its |error|."""
    rows, errors = [], []
    for case in found:
        data = measured.get(key(case))
        if data is None:
            continue
        ckpt = "yes" if case.get("ckpt") else "no"
        shape = (
            case["model"],
            case.get("seq", SEQ),
            case["stage"],
            case["world"],
            case["sp"],
            case["mlp"],
            case["loss"],
            ckpt,
            *([case["accum"]] if accum else []),
        )
        label = "| " + " | ".join(str(part) for part in (*shape, f"{case.get('bucket', BUCKET):.0e}")) + " |"
        if data["status"] != "ok":
            rows.append(f"{label} {data['status']} | | | |")
            continue
        est = estimate_case(case)
        true = max(r["peak_bytes"] for r in data["ranks"])
        error = est.per_gpu["total"] / true - 1
        errors.append(abs(error))
        during = max(data["ranks"], key=lambda r: r["peak_bytes"]).get("peak_during")
        rows.append(f"{label} {est.per_gpu['total'] / 2**20:.2f} | {true / 2**20:.2f} | {error:+.2%} | {during} |")
    return rows, errors


def render(measured: dict[str, dict[str, Any]]) -> str:
    """The Markdown tables (without, then with gradient accumulation): estimate, worst rank's true peak, error."""
    rows, errors = _rows(measured, [case for case in cases() if "accum" not in case], accum=False)
    header = (
        "| model | sequence | ZeRO | ranks | sp | tiled MLP | tiled loss | checkpointing | buckets | estimate MiB "
        "| true peak MiB | error | peak during |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    summary = f"\n\n{len(errors)} rows; worst |error| {max(errors, default=0.0):.2%}.\n"
    accumulated, accumulated_errors = _rows(measured, accumulation_cases(), accum=True)
    accumulation = (
        "\n## With gradient accumulation\n\n| model | sequence | ZeRO | ranks | sp | tiled MLP | tiled loss | "
        "checkpointing | accumulation | buckets | estimate MiB | true peak MiB | error | peak during |\n"
        + "|---" * 14
        + "|"
    )
    return (
        "# Ulysses SP: the estimate against the true peak (CPU ranks, bf16)\n\n"
        + header
        + "\n"
        + "\n".join(rows)
        + summary
        + NOTES
        + accumulation
        + "\n"
        + "\n".join(accumulated)
        + f"\n\n{len(accumulated_errors)} rows; worst |error| {max(accumulated_errors, default=0.0):.2%}.\n"
        + ACCUMULATION_NOTES
    )


def main() -> None:
    args, measured = gloo_ranks.bench_args(__doc__, "sp_true_peak", rank_main, render=True, md=True)
    if not args.render:
        for _, case_key, fresh in gloo_ranks.measured_cases(cases(), key, measure, measured, args):
            if not fresh:
                continue
            data = measured[case_key]
            print(
                case_key,
                data["status"],
                f"{data['wall_s']:.0f} s",
                [r and r["peak_bytes"] for r in data["ranks"]],
                data["error"][-1500:],
                flush=True,
            )
    args.md.write_text(render(measured))
    print(args.md.read_text())


if __name__ == "__main__":
    main()
