"""Quantized frozen weights: a 4-bit bitsandbytes base (QLoRA) and ZeRO-3's ``zero_quantized_nontrainable_weights``.
Neither runs on this project's CPU ranks (bitsandbytes' kernels and DeepSpeed's quantizer are CUDA code), so their
estimates are *estimate only*: read from the libraries' code, not measured.

**bitsandbytes 4-bit** (read in bitsandbytes at 95f9af3, ``bitsandbytes/_ops.py`` ``quantize_4bit`` fake kernel,
``functional.py`` ``quantize_4bit`` / ``quantize_blockwise`` / ``get_4bit_type``, ``nn/modules.py`` ``Params4bit``
(blocksize 64) and ``autograd/_functions.py`` ``MatMul4Bit``; transformers 5 ``integrations/bitsandbytes.py`` for
which weights are replaced: :func:`tuner.profile.hf.quantized_params`). A weight of ``n`` elements becomes:

* packed data: ``torch.empty(((n + 1) // (2·s), 1), dtype=quant_storage)`` with ``s`` the storage's item size, so
  ``((n + 1) // (2·s))·s`` bytes (≈ ``n/2``: 0.5 B per element whatever the storage dtype);
* its quant state (never a parameter, so never partitioned): ``absmax`` fp32 per block of 64,
  ``4·⌈n/64⌉`` bytes; with double quant (``bnb_4bit_use_double_quant``) instead ``quantize_blockwise(absmax -
  offset, blocksize=256)``: uint8 absmax ``⌈n/64⌉`` bytes, its fp32 absmax ``4·⌈⌈n/64⌉/256⌉`` bytes and the fp32
  offset (4 bytes); plus the 16-entry fp32 code table ``get_4bit_type`` makes per weight (64 bytes). The 256-entry
  fp32 dynamic map of double quant is cached once per device (``name2qmap["dynamic"]``: 1,024 bytes).
  Per element: 0.5 + 4/64 = 0.5625 B, or 0.5 + 1/64 + 4/16384 ≈ 0.5159 B with double quant.

Everything else (norms, embeddings, the LM head, biases, peft's adapters) keeps the dtype the model as trained
records. Not modelled: peft's ``prepare_model_for_kbit_training`` (``utils/other.py``), which casts every 16-bit
parameter that is not a ``Params4bit`` to fp32 (DeepSpeed casts them back at ZeRO 0-2, not at ZeRO-3).

The matmul dequantizes its weight whole: forward ``dequant + F.linear`` into the compute dtype (the fused
kernel's fallback for training-sized inputs, ``backends/cuda/ops.py``), backward ``dequantize_4bit(B, state)`` in
the dtype the weight was loaded in (the training dtype) then ``.to(grad_output.dtype)`` (the compute dtype): the
backward moment holds both when they differ (:func:`dequantized_weight_bytes`). Activations are the traced peft
model's (an unquantized base: the saved tensors are the same except when the compute dtype differs from the
training dtype, which the trace does not model).

ZeRO-3 (DeepSpeed 0.19.8): a quantized model is built without ``zero.Init`` (transformers'
``needs_zero3_init = ... and not _is_quantized``, ``modeling_utils.py``); the engine converts its parameters
afterwards (``DeepSpeedZeRoOffload._convert_to_zero_parameters``). Packed data stored as a 16/32-bit tensor is
partitioned like any parameter (the HF/peft recipe for QLoRA under ZeRO-3: ``bnb_4bit_quant_storage=bfloat16``);
uint8 storage is taken as not partitioned, whole on every rank, as reported (InternLM/xtuner#88, the reason the
recipe asks for a floating storage). DeepSpeed 0.19.8's own conversion (``partition_parameters.py``
``_convert_to_zero_parameters``) has no floating-point filter, so this rule is the reported behaviour, not a line
of DeepSpeed: one more reason the estimate is estimate only.

**zero_quantized_nontrainable_weights** (DeepSpeed 0.19.8 ``partition_parameters.py`` ``_partition_param`` and
``CUDAQuantizer``, ``csrc/quantization/pt_binding.cpp`` ``quantize_kernel``): a frozen parameter's shard of ``p``
elements is stored int8 (``p`` bytes) with one fp32 scale per group (symmetric: ``4·g`` bytes), ``g`` from
``CUDAQuantizer.quantize``'s search (:func:`quantizer_groups`); persistent whole copies and gathered parameters
stay in the training dtype. Only parameters frozen when they are first partitioned are quantized (DeepSpeed's
``quantize_nontrainable_params`` re-quantizes after peft freezes the base): the estimate assumes they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from tuner.estimator.settings import ConfigError
from tuner.estimator.states.trainable import TrainedParams
from tuner.workload import BLOCKSIZE, DTYPE_BYTES, NESTED_BLOCKSIZE, QuantSpec, Workload
from tuner.workload.measurable import beyond_positions

CODE_TABLE_BYTES = 16 * 4  # get_4bit_type: a 16-entry fp32 table per quantized weight
DYNAMIC_MAP_BYTES = 256 * 4  # double quant's dynamic map (create_dynamic_map), cached once per device
OFFSET_BYTES = 4  # double quant's fp32 offset (absmax.mean())
QUANTIZER_TARGET_GROUP = 8000  # CUDAQuantizer.target_group_size
QLORA_WHY = (
    "a 4-bit bitsandbytes base needs CUDA and bitsandbytes, which measured runs here do not have: bytes read from "
    "bitsandbytes' and DeepSpeed's code, not measured"
)
ZQNW_WHY = (
    "zero_quantized_nontrainable_weights needs DeepSpeed's CUDA quantizer, which measured runs here do not have: "
    "bytes read from DeepSpeed's code, not measured"
)


QWZ_QGZ_WHY = (
    "qwZ/qgZ (zero_quantized_weights, zero_quantized_gradients) need DeepSpeed's QuantizerBuilder, which needs CUDA: "
    "CPU ranks cannot measure them; their int8/int4 buffers are read from DeepSpeed's code, not measured"
)


def estimate_only_why(workload: Workload, quantized_nontrainable: bool, zero_quantized: bool = False) -> str:
    """Why no run here can check an estimate of ``workload`` (``""``: one can): a sequence longer than the model's
    learned position table (:func:`beyond_positions`: no run anywhere trains it), a 4-bit base,
    ``zero_quantized_nontrainable_weights`` in force (:attr:`Settings.quantized_nontrainable`), or qwZ/qgZ
    (``zero_quantized``) on CPU ranks."""
    beyond = beyond_positions(workload)
    if beyond:
        return beyond
    if workload.trainable.quantization:
        return QLORA_WHY
    if quantized_nontrainable:
        return ZQNW_WHY
    return QWZ_QGZ_WHY if zero_quantized and workload.cluster.device != "cuda" else ""


def packed_bytes(numel: int, storage: str) -> int:
    """Bytes of one weight's packed 4-bit data stored as ``storage`` (bitsandbytes ``quantize_4bit``).

    >>> packed_bytes(16384, "uint8"), packed_bytes(16384, "bfloat16"), packed_bytes(7, "float32")
    (8192, 8192, 4)
    """
    size = DTYPE_BYTES[storage]
    return (numel + 1) // (2 * size) * size


def packed_elements(numel: int, storage: str) -> int:
    """Elements of the packed tensor (what ZeRO-3 partitions when the storage is floating)."""
    return (numel + 1) // (2 * DTYPE_BYTES[storage])


def state_bytes(numel: int, double_quant: bool) -> int:
    """Bytes of one weight's quant state, the shared dynamic map left out (:data:`DYNAMIC_MAP_BYTES`).

    >>> state_bytes(16384, False), state_bytes(16384, True)
    (1088, 328)
    """
    blocks = -(-numel // BLOCKSIZE)
    if not double_quant:
        return 4 * blocks + CODE_TABLE_BYTES
    return blocks + 4 * -(-blocks // NESTED_BLOCKSIZE) + OFFSET_BYTES + CODE_TABLE_BYTES


@dataclass(frozen=True)
class QuantizedBase:
    """The 4-bit weights of a workload: their unquantized element counts, and what bitsandbytes holds for them."""

    spec: QuantSpec
    elements: int
    packed: int
    state: int
    largest: int

    @property
    def partitioned(self) -> bool:
        """Whether ZeRO-3 partitions the packed data (a floating storage)."""
        return self.spec.partitioned_by_zero3


def quantized_base(workload: Workload, params: TrainedParams) -> QuantizedBase | None:
    """The workload's 4-bit base, or None without one."""
    spec = workload.trainable.quant
    if spec is None:
        return None
    numels = [n for n, q in zip(params.numels, params.quantized, strict=True) if q] if params.quantized else []
    if not numels:
        return QuantizedBase(spec, 0, 0, 0, 0)
    state = sum(state_bytes(n, spec.double_quant) for n in numels) + (DYNAMIC_MAP_BYTES if spec.double_quant else 0)
    packed = sum(packed_bytes(n, spec.storage) for n in numels)
    return QuantizedBase(spec, sum(numels), packed, state, max(numels))


def stage3_view(params: TrainedParams, base: QuantizedBase, elem: int) -> tuple[TrainedParams, int]:
    """The parameters as ZeRO-3 holds them, and the bytes it leaves whole on every rank.

    A floating storage's packed data is partitioned: each quantized weight counts as its packed bytes in elements
    of the training dtype (``⌈packed / e⌉``; exact for a storage of the training dtype). A uint8 one stays whole:
    dropped from the partitioned parameters, its bytes returned with the quant state's.
    """
    numels, mask, fp32 = [], [], []
    replicated = base.state
    upcast = params.fp32 or (False,) * len(params.numels)
    trains = params.mask or (True,) * len(params.numels)
    marks = params.quantized or (False,) * len(params.numels)
    for numel, quantized, up, train in zip(params.numels, marks, upcast, trains, strict=True):
        if quantized:
            held = packed_bytes(numel, base.spec.storage)
            if not base.partitioned:
                replicated += held
                continue
            numel = -(-held // elem)
        numels.append(numel)
        mask.append(train)
        fp32.append(up)
    view = replace(
        params,
        numels=tuple(numels),
        mask=tuple(mask) if params.mask else (),
        fp32=tuple(fp32) if params.fp32 else (),
        quantized=(),
    )
    return view, replicated


def dequantized_weight_bytes(base: QuantizedBase, elem: int) -> int:
    """Backward's dequantized copy of the largest 4-bit weight: in the training dtype the weight was loaded in, and
    its copy in the compute dtype when that differs (``MatMul4Bit.backward``)."""
    compute = DTYPE_BYTES[base.spec.compute_dtype]
    return base.largest * (elem + (compute if compute != elem else 0))


@lru_cache(maxsize=4096)
def quantizer_groups(numel: int) -> int:
    """Groups (one fp32 scale each) DeepSpeed's ``CUDAQuantizer.quantize`` cuts a shard of ``numel`` into: the
    smallest ``g ≥ ⌈numel/8000⌉`` with ``numel % (8·g) == 0``, doubled while ``numel % (16·g) == 0`` and groups stay
    above 8,000 elements. DeepSpeed asserts ``numel % 8 == 0``: refused otherwise, naming the key.

    >>> quantizer_groups(16384), quantizer_groups(8192), quantizer_groups(10**6)
    (4, 2, 125)
    """
    if numel <= 0:
        return 0
    if numel % 8:
        raise ConfigError(
            "zero_optimization.zero_quantized_nontrainable_weights",
            f"DeepSpeed's quantizer needs frozen shards of a multiple of 8 elements, one has {numel}",
        )
    start, eighths = math.ceil(numel / QUANTIZER_TARGET_GROUP), numel // 8
    divisors: set[int] = set()
    for d in range(1, math.isqrt(eighths) + 1):
        if eighths % d == 0:
            divisors.update((d, eighths // d))
    groups = min(d for d in divisors if d >= start)
    while numel % (16 * groups) == 0 and numel / groups > QUANTIZER_TARGET_GROUP:
        groups *= 2
    return groups


def quantized_shard_bytes(part: int) -> int:
    """A frozen shard of ``part`` elements under ``zero_quantized_nontrainable_weights``: int8 data and fp32
    scales."""
    return part + 4 * quantizer_groups(part) if part else 0
