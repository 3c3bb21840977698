"""Where a trial's layout and long-context settings meet the workload: what DeepSpeed's Ulysses and ALST accept.

Refused in one line naming the field, before any work (DeepSpeed 0.19.8, ``runtime/sequence_parallel/ulysses_sp.py``):

- ``sequence_parallel_size`` must divide the ranks (the data-parallel degree is ranks / sp), the attention heads
  (``UlyssesSPAttentionHF``: "Attention head count ... is not divisible by SP size") and the sequence length (each
  rank holds ``s/sp`` tokens; the data-loader adapter refuses the rest). Key-value heads: their count must divide sp
  or sp divide it. With fewer key-value heads than sp, Ulysses replicates each of them ``sp / kv`` times before the
  all-to-all (``repeat_interleave`` on the head axis), so every rank attends with one key-value head.
- Eager attention is refused by Ulysses (``register_with_transformers``: it needs a 4-D mask of ``s²`` elements).
- ``dstune.tiled_mlp_shards`` and ``dstune.tiled_loss_shards`` cannot exceed the tokens a rank holds (``torch.chunk``
  would make fewer shards than asked).
- ``dstune.offload_checkpoints`` moves the checkpointed layer inputs to host memory: it needs activation
  checkpointing.

The check of a trial is Ulysses' (:func:`tuner.workload.layouts.ulysses.check_long_context`).

Example:
    >>> from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, check_long_context, load_builtin_model
    >>> work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=4096))
    >>> check_long_context(work, TrialConfig({"sequence_parallel_size": 8}))
    >>> check_long_context(work, TrialConfig({"sequence_parallel_size": 3}))
    Traceback (most recent call last):
    tuner.workload.config_values.ConfigError: sequence_parallel_size: sp = 3 must divide the 8 ranks
"""

from __future__ import annotations

from tuner.workload.spec import Workload

SP_KEY = "sequence_parallel_size"


def kv_replication(kv_heads: int, sp: int) -> int:
    """How many times Ulysses repeats each key-value head before its all-to-all (1: none; sp > kv heads: sp / kv).

    >>> kv_replication(8, 4), kv_replication(2, 8), kv_replication(0, 4)
    (1, 4, 1)
    """
    return sp // kv_heads if kv_heads and sp > kv_heads else 1


def sequence_parallel_problem(workload: Workload, sp: int) -> str | None:
    """Why Ulysses cannot run at degree ``sp`` on ``workload`` (ranks, heads, key-value heads, sequence length,
    attention), or None when it can; the ranks are checked with the tensor-parallel degree by the layout.

    >>> from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model
    >>> work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=4096))
    >>> [sp for sp in (1, 2, 3, 4, 8, 16) if sequence_parallel_problem(work, sp) is None]
    [1, 2, 4, 8]
    """
    if sp == 1:
        return None
    world, seq, model = workload.cluster.world_size, workload.train.seq_len, workload.model
    heads, kv = model.num_heads, model.num_kv_heads or model.num_heads
    if world % sp:
        return f"sp = {sp} must divide the {world} ranks"
    if heads and heads % sp:
        return f"sp = {sp} must divide the {heads} attention heads (DeepSpeed's Ulysses)"
    if heads and kv % sp and sp % kv:
        return f"sp = {sp} and the {kv} key-value heads must divide one another (Ulysses replicates kv heads)"
    if seq % sp:
        return f"sp = {sp} must divide the sequence length {seq} (each rank holds s/sp tokens)"
    if workload.train.attention == "eager":
        return "Ulysses refuses eager attention (a 4-D s² mask): use sdpa or flash attention"
    return None


__all__ = ["SP_KEY", "kv_replication", "sequence_parallel_problem"]
