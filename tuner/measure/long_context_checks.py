"""What a measured run refuses of a trial's long-context settings, before any rank starts (pure Python).

Ulysses sequence parallelism, ALST's tiled MLP and tiled loss are applied by the runner to a transformers model
(:mod:`tuner.measure.rank.layouts.ulysses`, :mod:`tuner.measure.rank.layouts.alst`); the built-in model
(:mod:`tuner.measure.rank.models`) has no Ulysses attention and is refused for them. Checkpoint offload keeps the
checkpointed layer inputs in pinned host memory, which needs CUDA: on CPU ranks it is estimated, not measured
(DeepSpeed's ``cpu_checkpointing`` empties the tensor that ``.to('cpu')`` returns unchanged on CPU, and pinning needs a
GPU).
"""

from __future__ import annotations

from tuner.measure.layout_checks import layout_refusal
from tuner.workload import TrialConfig, Workload
from tuner.workload.layouts import ULYSSES
from tuner.workload.numerics import LIGER_KEY

BUILT_IN = "needs the transformers model (model_impl transformers): the built-in model has no Ulysses attention"
OFFLOAD_ON_CPU = (
    "checkpoint offload to pinned host memory needs CUDA ranks; on CPU ranks it is estimated only "
    "(dstune estimate), not measured"
)


def measured_refusal(workload: Workload, trial: TrialConfig, device: str) -> tuple[str, str] | None:
    """``(field, reason)`` when a run of ``trial`` on ``workload`` cannot be measured on ``device``, else None;
    AutoTP and ZeRO++ settings too (:func:`tuner.measure.layout_checks.layout_refusal`).

    >>> from tuner.workload import ClusterSpec, TrainSpec, load_builtin_model
    >>> tiny = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec())
    >>> measured_refusal(tiny, TrialConfig({"sequence_parallel_size": 2}), "cpu")[0]
    'sequence_parallel_size'
    >>> measured_refusal(tiny, TrialConfig({}), "cpu") is None
    True
    """
    refusal = layout_refusal(workload, trial, device)
    if refusal is not None:
        return refusal
    if trial.numerics.liger:
        return LIGER_KEY, "Liger's kernels need Triton on a GPU and dstune's runner does not apply them: estimate only"
    sp, context = trial.layout.degree(ULYSSES), trial.long_context
    transformers = workload.model.implementation == "transformers"
    if not transformers:
        for field, on in (
            (ULYSSES.key, sp > 1),
            ("dstune.tiled_mlp_shards", context.tiled_mlp_shards > 1),
            ("dstune.tiled_loss_shards", context.tiled_loss_shards > 1),
            ("dstune.offload_checkpoints", context.offload_checkpoints),
        ):
            if on:
                return field, BUILT_IN
    if context.offload_checkpoints and device != "cuda":
        return "dstune.offload_checkpoints", OFFLOAD_ON_CPU
    if context.offload_checkpoints and not trial.activation_checkpointing:
        return "dstune.offload_checkpoints", "offloads the checkpointed layer inputs: turn activation checkpointing on"
    if context.tiled_loss_shards > 1 and trial.precision == "fp16":
        return "dstune.tiled_loss_shards", (
            "TiledFusedLogitsLoss computes lm_head's gradient inside forward, before fp16's loss scale; use bf16"
        )
    if sp > 1 and workload.train.attention == "eager":
        return "attention", "Ulysses refuses eager attention (it needs a 4-D mask over the whole sequence); use sdpa"
    local = workload.train.seq_len // sp
    if sp > 1 and workload.train.seq_len % sp:
        return ULYSSES.key, f"{sp} must divide the sequence length"
    for field, shards in (
        ("dstune.tiled_mlp_shards", context.tiled_mlp_shards),
        ("dstune.tiled_loss_shards", context.tiled_loss_shards),
    ):
        if shards > local:
            return field, f"{shards} shards exceed the {local} tokens a rank holds"
    return None


__all__ = ["measured_refusal"]
