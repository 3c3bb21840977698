"""ZeRO++'s quantized communication at ZeRO-3: qwZ (``zero_quantized_weights``) and qgZ
(``zero_quantized_gradients``), their staging buffers and the bytes they put on the wire.

Read from DeepSpeed 0.19.8's code (both need its CUDA ``QuantizerBuilder``: no run here can measure them):

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

from tuner.estimator.settings import FP32, Settings
from tuner.estimator.states.quantized import QUANTIZER_TARGET_GROUP

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


__all__ = [
    "QGZ_CALLS_PER_TENSOR",
    "gathered_bytes_per_element",
    "qgz_reduce_transient",
    "qgz_seconds",
    "qwz_staging_bytes",
]
