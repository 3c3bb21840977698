"""What an exported config needs beside it when the trial trains long sequences: Ulysses sequence parallelism and
ALST's tiled MLP, tiled loss and checkpoint offload (pure Python).

``sequence_parallel_size`` stays in the exported ds_config (DeepSpeed's batch arithmetic divides the world by it),
but DeepSpeed alone does not split anything: the training code registers Ulysses with transformers' attention,
hands the mpu to ``deepspeed.initialize``, shards each batch over the sequence-parallel group and reduces the loss
over it. dstune's ``dstune`` section (the ALST pieces) is not read by DeepSpeed and is left out of the export: the
notes say what to apply instead.

* ``--format deepspeed``: :func:`deepspeed_notes`, the calls a hand-written DeepSpeed loop makes.
* ``--format hf``: :func:`hf_snippet`, the transformers Trainer with accelerate's ``ParallelismConfig``
  (``sp_backend="deepspeed"``, accelerate >= 1.12): accelerate then registers Ulysses
  (``UlyssesSPAttentionHF.register_with_transformers``), passes its mpu to DeepSpeed and wraps the training
  DataLoader with ``UlyssesSPDataLoaderAdapter``; the Trainer reduces the loss over the group. The batches must
  carry ``position_ids``.
"""

from __future__ import annotations

from tuner.workload import TrialConfig
from tuner.workload.layouts import ULYSSES as ULYSSES_LAYOUT

ULYSSES = "deepspeed.runtime.sequence_parallel.ulysses_sp"


def deepspeed_notes(trial: TrialConfig, attention: str, seq_len: int | None) -> list[str]:
    """What a plain DeepSpeed training loop must do for ``trial``'s sequence parallelism and ALST pieces.

    Example:
        >>> notes = deepspeed_notes(TrialConfig({"sequence_parallel_size": 2, "train_micro_batch_size_per_gpu": 1,
        ...                                      "zero_optimization": {"stage": 3}}), "sdpa", 4096)
        >>> "register_with_transformers" in notes[0], "ZeRO-3" in notes[0]
        (True, True)
    """
    notes = []
    sp = trial.layout.degree(ULYSSES_LAYOUT)
    if sp > 1:
        micro = trial.batch[0] or 1
        length = f"seq_length={seq_len}, seq_length_is_variable=False" if seq_len else "seq_length_is_variable=True"
        reduction = (
            "ZeRO-3: backpropagate sp × your share (the tutorial's differentiable all_gather of the shares does that)"
            if trial.stage == 3
            else f"ZeRO-{trial.stage}: backpropagate each rank's own share (DeepSpeed 0.19.8 sums the "
            "sequence-parallel ranks' gradients at stages 0-2; the tutorial's all_gather of the shares would "
            "double them at sp=2)"
        )
        notes.append(
            f"sequence_parallel_size {sp} (Ulysses): mpu = {ULYSSES}.UlyssesSPAttentionHF.register_with_transformers("
            f'model, core_attn_implementation="{attention_name(attention)}", sequence_parallel_size={sp}, '
            f"micro_batch_size={micro}, {length}) before training; deepspeed.initialize(..., mpu=mpu); wrap the "
            f"DataLoader in {ULYSSES}.UlyssesSPDataLoaderAdapter(dl, sp_rank=mpu.get_sequence_parallel_rank(), "
            "sp_group=mpu.get_sequence_parallel_group(), sp_world_size=mpu.get_sequence_parallel_world_size(), "
            "device=engine.device) (batches carry input_ids, position_ids, labels; it hands back shift_labels); the "
            "loss: each rank's summed loss over its shift_labels / the group's count of labels != -100 (an "
            f"all_reduce), then {reduction}"
        )
    notes.extend(alst_notes(trial))
    return notes


def alst_notes(trial: TrialConfig) -> list[str]:
    """The ALST pieces the ``dstune`` section asked for, as calls to DeepSpeed's classes."""
    context, notes = trial.long_context, []
    if context.tiled_mlp_shards > 1:
        notes.append(
            f"dstune.tiled_mlp_shards {context.tiled_mlp_shards}: run each decoder layer's MLP through "
            f"{ULYSSES}.TiledMLP.apply(mlp_forward, mlp, x, {context.tiled_mlp_shards}, list(mlp.parameters()))"
        )
    if context.tiled_loss_shards > 1:
        notes.append(
            f"dstune.tiled_loss_shards {context.tiled_loss_shards}: compute logits and loss with "
            f"{ULYSSES}.TiledFusedLogitsLoss.apply(loss_fn, lm_head, hidden_states, shift_labels, None, "
            f'{context.tiled_loss_shards}, [lm_head.weight], "sum") (it makes lm_head\'s gradient inside forward: '
            "scale loss_fn's summed loss by the final weight and 1/gradient_accumulation_steps)"
        )
    if context.offload_checkpoints:
        notes.append(
            "dstune.offload_checkpoints: with activation checkpointing, keep each checkpointed layer's input in "
            "pinned host memory (ALST's checkpoint offload; torch.autograd.graph.save_on_cpu(pin_memory=True) "
            "does not reach what non-reentrant checkpointing keeps)"
        )
    return notes


def attention_name(attention: str) -> str:
    """transformers' ``attn_implementation`` for dstune's attention kind."""
    return {"flash": "flash_attention_2"}.get(attention, attention)


def hf_problem(trial: TrialConfig) -> str | None:
    """Why the Hugging Face Trainer would not train ``trial`` as it was measured (None: it would): with Ulysses below
    ZeRO-3 its loss reduction over the sequence-parallel group gives sp times the gradient (DeepSpeed 0.19.8 sums
    the group's gradients below ZeRO-3), and clipping then acts at 1/sp of its threshold. ZeRO-3 is exact.

    >>> hf_problem(TrialConfig({"sequence_parallel_size": 2, "zero_optimization": {"stage": 2}}))
    "trains 2x the gradient under the Trainer's sequence-parallel loss reduction at ZeRO-2 (exact at ZeRO-3)"
    >>> hf_problem(TrialConfig({"sequence_parallel_size": 2, "zero_optimization": {"stage": 3}})) is None
    True
    """
    sp = trial.layout.degree(ULYSSES_LAYOUT)
    if sp == 1 or trial.stage == 3:
        return None
    reduction = "the Trainer's sequence-parallel loss reduction"
    return f"trains {sp}x the gradient under {reduction} at ZeRO-{trial.stage} (exact at ZeRO-3)"


def hf_snippet(trial: TrialConfig, attention: str, seq_len: int | None) -> str | None:
    """Python that trains ``trial``'s sequence parallelism with the transformers Trainer (None without it).

    Example:
        >>> print(hf_snippet(TrialConfig({"sequence_parallel_size": 2}), "sdpa", 1024).splitlines()[0])
        # Ulysses sequence parallelism 2 with the HF Trainer (transformers >= 5, accelerate >= 1.12):
    """
    sp = trial.layout.degree(ULYSSES_LAYOUT)
    if sp == 1:
        return None
    length = (
        f"sp_seq_length={seq_len}, sp_seq_length_is_variable=False" if seq_len else "sp_seq_length_is_variable=True"
    )
    return "\n".join(
        [
            f"# Ulysses sequence parallelism {sp} with the HF Trainer (transformers >= 5, accelerate >= 1.12):",
            "# accelerate calls UlyssesSPAttentionHF.register_with_transformers(...) and passes its mpu to",
            "# deepspeed.initialize, and wraps the training DataLoader in UlyssesSPDataLoaderAdapter; the Trainer",
            "# reduces the loss over the sequence-parallel group. Every batch must carry position_ids.",
            *(
                [
                    f"# ZeRO-{trial.stage}: the Trainer's reduction (a differentiable all_gather of the shares) gives "
                    f"{sp}x the gradient here",
                    "# (DeepSpeed 0.19.8 sums the sequence-parallel ranks' gradients below ZeRO-3; measured at sp=2: "
                    "grad norm 2x one rank's);",
                    f"# gradient clipping then acts at 1/{sp} of its threshold. ZeRO-3 gets the exact gradient.",
                ]
                if trial.stage < 3
                else []
            ),
            "from accelerate.parallelism_config import ParallelismConfig",
            "from accelerate.utils import DeepSpeedSequenceParallelConfig",
            "parallelism = ParallelismConfig(",
            f'    sp_backend="deepspeed", sp_size={sp}, dp_shard_size=WORLD_SIZE // {sp},',
            f"    sp_handler=DeepSpeedSequenceParallelConfig({length},",
            f'                                               sp_attn_implementation="{attention_name(attention)}"),',
            ")",
            f'model = AutoModelForCausalLM.from_pretrained(NAME, attn_implementation="{attention_name(attention)}")',
            "args = TrainingArguments(..., deepspeed=DS_CONFIG, parallelism_config=parallelism)",
        ]
    )


__all__ = ["alst_notes", "deepspeed_notes", "hf_problem", "hf_snippet"]
