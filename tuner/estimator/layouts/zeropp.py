"""ZeRO++ at ZeRO-3: hpZ's secondary partition (``zero_hpz_partition_size``), and the quantized communication of qwZ
(``zero_quantized_weights``) and qgZ (``zero_quantized_gradients``), their staging buffers and the bytes they put on
the wire.

hpZ (``zero_hpz_partition_size`` = g, ZeRO-3): ``_partition_param_sec`` gives a parameter a secondary partition
over its hpZ group when it is released (partitioned) after use, ``aligned numel / g`` elements in the parameter's
dtype; backward gathers from it inside the group, and the optimizer step drops them all
(``invalidate_secondary_tensor``). Up to ``e·Ψ/g`` per rank beside the primary shard, by phase
(:func:`hpz_secondary_bytes`): measured on 4 CPU ranks with hpZ = 2 (``bench/tp_true_peak.py``), a tiny model whose
parameters ZeRO-3 keeps gathered from forward into backward peaks with no secondary partition alive, to the byte.

qwZ and qgZ, read from DeepSpeed 0.19.8's code (both need its CUDA ``QuantizerBuilder``: no run here can measure them):

* qwZ: every parameter all-gather (forward, backward, the recomputed forward, from the primary partition or hpZ's
  secondary one; ``partitioned_param_coordinator.py:578-580``) quantizes the rank's shard to int8 in groups of at
  most ``CUDAQuantizer.target_group_size`` (8,000) elements with one fp32 scale each, and gathers into an int8
  ``flat_tensor`` of the whole gathered set plus a fp32 ``quant_scale_buffer``
  (``partition_parameters.py:1485-1520``), dequantized into the parameters when the gather completes. On the wire:
  1 byte per element and the scales, instead of the 16-bit 2.
* qgZ: ZeRO-3's gradient reduction (``stage3.py`` ``__avg_scatter_grads``) runs ``all_to_all_quant_reduce``
  (``comm/coalesced_collectives.py:31-76``) per gradient tensor: quantized to int4, an all-to-all within the node
  (the node's ``L`` GPUs), a quantized reduction to ``1/L`` of the tensor, an all-to-all across the nodes, then
  dequantized to fp16. Per tensor it holds its int4 copy and the one received (``numel / 2`` bytes each), their
  reduced halves (``numel / 2L`` each) and the fp16 result (``2 numel / L``): the tensors run one after the other,
  so the largest sets the transient; the flat concatenation of a bucket that ``reduce_scatter_coalesced`` makes
  without qgZ is not made. On the wire: ``(L-1)/L`` of ``numel / 2`` bytes over the node's links and ``(n-1)/n`` of
  ``numel / 2L`` across the ``n`` nodes, instead of a 16-bit reduce-scatter of ``(N-1)/N × 2 numel`` bytes; four
  all-to-all calls per tensor (data and scales, within and across nodes). One-dimensional gradients (norms, biases)
  fall back to the plain reduce-scatter: counted as the others here (they are a small share of the bytes).
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.estimator.layouts.base import LayoutTerms
from tuner.estimator.settings import FP32, Settings
from tuner.estimator.states.partitions import stage3_layout
from tuner.estimator.states.quantized import QUANTIZER_TARGET_GROUP
from tuner.estimator.terms import NOTHING, Contribution, Held, detail
from tuner.workload import Ranks
from tuner.workload.layouts import HPZ as HPZ_KIND

INT8, INT4 = 1.0, 0.5  # bytes per element
QGZ_CALLS_PER_TENSOR = 4


def gathered_bytes_per_element(s: Settings) -> float:
    """Bytes one gathered parameter element puts on the wire: int8 and its share of a fp32 scale under qwZ, else the
    16-bit (or fp32) parameter.

    >>> from types import SimpleNamespace
    >>> gathered_bytes_per_element(SimpleNamespace(quantized_weights=True, param_bytes=2))
    1.0005
    """
    return INT8 + FP32 / QUANTIZER_TARGET_GROUP if s.quantized_weights else float(s.param_bytes)


def qwz_staging_bytes(gathered_elements: int) -> int:
    """Bytes of qwZ's int8 gather buffer and its fp32 scales for ``gathered_elements`` gathered at once."""
    return round(gathered_elements * (INT8 + FP32 / QUANTIZER_TARGET_GROUP))


def qgz_reduce_transient(largest: int, local_ranks: int) -> int:
    """Bytes qgZ's reduction of the largest gradient tensor (``largest`` elements) holds at once, the node's
    ``local_ranks`` GPUs sharing the reduction (module docstring).

    >>> qgz_reduce_transient(8000, 8)  # 4000 + 4000 + 500 + 500 + 2000
    11000
    """
    local = max(1, local_ranks)
    return round(largest * (2 * INT4 + 2 * INT4 / local + 2 / local))


def qgz_seconds(trained: int, world: int, local_ranks: int, intra_bw: float, inter_bw: float) -> float:
    """Seconds of one micro-step's qgZ gradient reduction of ``trained`` elements over ``world`` ranks in nodes of
    ``local_ranks``: int4 all-to-all within the node, then the reduced ``1/L`` across the nodes."""
    local = max(1, min(local_ranks, world))
    nodes = max(1, world // local)
    within = (local - 1) / local * INT4 * trained / intra_bw
    across = (nodes - 1) / nodes * INT4 * trained / local / inter_bw
    return within + across


def hpz_secondary_bytes(numels: tuple[int, ...], s: Settings, kept: int = 0) -> dict[str, int]:
    """Bytes of hpZ's secondary partition on one rank, by phase (module docstring): each partitioned parameter's
    ZeRO-aligned size over the hpZ group, in the training dtype, for the parameters released since the last step
    (the step drops them all: ``invalidate_secondary_tensor``; a release re-creates one). After backward and in the
    step every non-persistent parameter has been released; after forward all but the ``kept`` elements ZeRO-3 keeps
    gathered for backward. Empty without hpZ or outside ZeRO-3.

    >>> from tuner.estimator.settings import Settings
    >>> from tuner.workload import ParallelLayout, Ranks
    >>> fields = dict(world_size=4, micro_batch=1, grad_accum=1, global_batch=4, precision="bf16", stage=3,
    ...     overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=1, allgather_bucket_size=1,
    ...     offload_optimizer="none", offload_optimizer_pin=False, offload_optimizer_buffer_count=4,
    ...     offload_param="none", offload_param_pin=False, offload_param_buffer_count=5, offload_param_buffer_size=1,
    ...     max_live_parameters=1, max_reuse_distance=1, prefetch_bucket_size=1, param_persistence_threshold=0,
    ...     model_persistence_threshold=0, sub_group_size=1, ranks=Ranks(4, hpz=2),
    ...     layout=ParallelLayout(hpz_partition_size=2))
    >>> hpz_secondary_bytes((1000, 6), Settings(**fields), kept=1000)  # (1000 + 8) / 2 × 2 B
    {'forward': 8, 'backward': 1008, 'step': 1008}
    """
    group = s.layout.hpz_partition_size
    if s.stage != 3 or group <= 1:
        return {}
    ranks = s.zero_ranks  # AutoTP's replicated parameters counted as the sharded ones: unmeasured
    parts, persists = stage3_layout(numels, ranks, s.param_persistence_threshold, s.model_persistence_threshold)
    full = s.param_bytes * sum(part for part, keep in zip(parts, persists, strict=True) if not keep) * ranks // group
    return {"forward": max(0, full - s.param_bytes * kept // group), "backward": full, "step": full}


def hpz_secondary(numels: tuple[int, ...], s: Settings, kept: int, offloaded: bool) -> Contribution:
    """hpZ's secondary partition (:func:`hpz_secondary_bytes`) as the parameters it holds by phase, on the host when
    the parameters are ``offloaded`` (``offload_param``); the figure recorded is the step's (every parameter
    released)."""
    by_phase = hpz_secondary_bytes(numels, s, kept)
    if not by_phase:
        return NOTHING
    where = "cpu" if offloaded else "gpu"
    sizes = (Held(where, "parameters", size, (phase,)) for phase, size in by_phase.items())
    return (*detail("hpz_secondary_partition", by_phase["step"]), *sizes)


class HpzTerms(LayoutTerms):
    """ZeRO++'s hpZ in the estimator (ZeRO-3 only, where its group is more than one rank): the secondary partition
    beside the model states (:func:`hpz_secondary`); its gathers' time is in ZeRO-3's
    (:func:`tuner.estimator.throughput.prediction.zero3_gather_seconds`)."""

    kind = HPZ_KIND

    def group(self, ranks: Ranks) -> int:
        return ranks.hpz

    def state_terms(self, numels: tuple[int, ...], s: Settings, details: Mapping[str, int]) -> Contribution:
        kept = details.get("gathered_parameters", 0) // s.param_bytes  # what forward keeps gathered for backward
        return hpz_secondary(numels, s, kept, s.offload_param != "none")


HPZ = HpzTerms()


__all__ = [
    "HPZ",
    "QGZ_CALLS_PER_TENSOR",
    "gathered_bytes_per_element",
    "hpz_secondary",
    "hpz_secondary_bytes",
    "qgz_reduce_transient",
    "qgz_seconds",
    "qwz_staging_bytes",
]
