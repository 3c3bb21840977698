"""The Muon optimizer at ZeRO-1/2 (``optimizer.type: "muon"``), as DeepSpeed 0.19.8 holds it per rank.

* The split (``deepspeed.set_optimizer_flags``): a parameter is Muon's when it has two or more dimensions and no
  ``embed`` or ``lm_head`` in its name; the rest (norms, biases, embeddings, the LM head) are Adam's. The engine
  makes one group of each (``engine._muon_param_groups``, the Muon half first), and ZeRO-1/2 flattens, pads and
  partitions each group on its own (:func:`muon_flat_partition`).
* Both groups keep a master partition (fp32, or bf16 with ``bf16_master_weights_and_grads``); only the Adam
  group has Adam's two moments (the auxiliary Adam steps it; Muon's flat partition needs no state of its own).
* The Muon group's momentum is made at the end of the first backward (``stage_1_and_2.get_flat_partition`` →
  ``_muon_momentum_buffer``): one flat buffer the size of the parameters overlapping the rank's partition, whole,
  in the gradients' dtype; beside it the staged copy each step writes before it commits (``_muon_staging_momentum``,
  kept between steps). :func:`muon_states` counts them.
* ``muon_update`` orthogonalises one whole gradient at a time (Newton-Schulz on the gradient, in fp16 where the
  device supports it, else fp32; bf16 for the ``standard`` method); its temporaries for the largest Muon matrix
  are :func:`muon_update_transient`; what it returns is kept until the step (:func:`muon_updates`).

Which parameters have two dimensions is read from the model's shapes (:func:`muon_mask`): the embeddings and the
LM head (``vocab × hidden``, the learned position table) are Adam's, every other parameter larger than the layer's
widest vector (norm weights, biases) Muon's.
"""

from __future__ import annotations

from tuner.estimator.settings import FP32, Settings
from tuner.estimator.states.partitions import FlatPartition, flat_partition
from tuner.workload import ConfigError, ModelSpec

NS_TEMPORARIES = 6  # Newton-Schulz's gradient-sized temporaries alive at once (measured, bench/precision_true_peak.py)


def muon_mask(model: ModelSpec) -> tuple[bool, ...]:
    """Which of ``model.param_numels`` Muon steps (the rest Adam).

    Example:
        >>> from tuner.workload import load_builtin_model
        >>> model = load_builtin_model("tiny-llama")
        >>> mask = muon_mask(model)
        >>> sum(n for n, m in zip(model.param_numels, mask) if not m) == 2 * model.vocab_size * model.hidden_size \\
        ...     + model.hidden_size * (2 * model.num_layers + 1)
        True
    """
    if model.is_bare:
        raise ConfigError("optimizer.type", "Muon needs the model's shapes (which parameters are matrices)")
    h = model.hidden_size
    embeddings = {model.vocab_size * h}
    if model.learned_positions:
        embeddings.add(model.max_positions * h)
    widest = max(h, model.num_heads * model.head_dim * 3, model.intermediate_size * 2)  # fused qkv, gate-up biases
    return tuple(numel > widest and numel not in embeddings for numel in model.param_numels)


def split(numels: tuple[int, ...], mask: tuple[bool, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(Muon's parameters, Adam's), each in model order."""
    muon = tuple(n for n, on in zip(numels, mask, strict=True) if on)
    adam = tuple(n for n, on in zip(numels, mask, strict=True) if not on)
    return muon, adam


def muon_flat_partition(model: ModelSpec, numels: tuple[int, ...], s: Settings) -> FlatPartition:
    """ZeRO-1/2's flat buffers of one rank under Muon: the Muon group and the Adam group each padded and partitioned
    over :attr:`.Settings.zero_ranks`, summed (the worst rank's gradients add each group's worst rank: an upper
    bound when they are different ranks)."""
    parts = [flat_partition(group, s.zero_ranks) for group in split(numels, muon_mask(model)) if group]
    return FlatPartition(
        sum(p.padded_total for p in parts),
        sum(p.partition for p in parts),
        sum(p.worst_rank_grads for p in parts),
        tuple(p.partition for p in parts),
    )


def muon_states(model: ModelSpec, numels: tuple[int, ...], s: Settings, master: int, elem: int) -> int:
    """Bytes of one rank's optimizer states under Muon: both groups' master partitions (``master`` bytes per
    element), Adam's two fp32 moments on the Adam group's, and the Muon group's momentum and its staged copy (the
    overlapping parameters whole, ``elem`` bytes per element, the gradients' dtype)."""
    muon, adam = split(numels, muon_mask(model))
    muon_part = flat_partition(muon, s.zero_ranks) if muon else FlatPartition(0, 0, 0)
    adam_part = flat_partition(adam, s.zero_ranks) if adam else FlatPartition(0, 0, 0)
    masters = master * (muon_part.partition + adam_part.partition)
    moments = 2 * FP32 * adam_part.partition
    momentum = 2 * elem * muon_part.worst_rank_grads
    return masters + moments + momentum


def muon_updates(model: ModelSpec, numels: tuple[int, ...], s: Settings, elem: int) -> int:
    """Bytes of the Muon group's orthogonalised gradients on the worst rank: ``get_flat_partition`` keeps what
    ``muon_update`` returns for each parameter overlapping the partition (whole, ``elem`` bytes an element) as the
    group's ``averaged_gradients``, from the end of backward until the step has cast them (the 16-bit gradient
    buffer they were made from stays alive too)."""
    muon, _ = split(numels, muon_mask(model))
    return elem * flat_partition(muon, s.zero_ranks).worst_rank_grads if muon else 0


def muon_update_transient(model: ModelSpec, numels: tuple[int, ...], device: str) -> int:
    """Bytes ``muon_update`` allocates at its worst for the largest Muon matrix: Newton-Schulz runs in fp16 on
    CUDA and in fp32 on CPUs without fp16 (DeepSpeed's ``ns_compute_dtype``)."""
    muon, _ = split(numels, muon_mask(model))
    compute = 2 if device == "cuda" else FP32
    return NS_TEMPORARIES * compute * max(muon, default=0)


__all__ = ["muon_flat_partition", "muon_mask", "muon_states", "muon_update_transient", "muon_updates", "split"]
