"""A 4-bit bitsandbytes base (QLoRA): the ``quantization_config`` object transformers writes into ``config.json``
(``BitsAndBytesConfig.to_dict()``), checked field by field. Pure Python.

Defaults are transformers' ``BitsAndBytesConfig``'s (5.x): ``bnb_4bit_quant_type`` fp4, no double quant, compute
dtype float32, storage uint8, ``llm_int8_skip_modules`` None (transformers then keeps the output embedding, tied
weights and the last module in full precision). The block size is bitsandbytes' ``Params4bit`` default (64):
transformers has no field for it. 8-bit loading (``load_in_8bit``) is not modelled and is refused.

Example:
    >>> QuantSpec.of({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"})
    QuantSpec(quant_type='fp4', double_quant=False, storage='bfloat16', compute_dtype='float32', skip_modules=None)
    >>> QuantSpec.of({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"})
    Traceback (most recent call last):
    tuner.errors.InputError: quantization.bnb_4bit_quant_type: must be nf4 or fp4, got 'int4'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tuner.errors import InputError

DTYPE_BYTES = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "float32": 4}
STORAGE_DTYPES = ("uint8", "bfloat16", "float16", "float32")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
QUANT_TYPES = ("nf4", "fp4")
MEASURED_QUANTIZATION = "a 4-bit bitsandbytes base is estimate only: measured runs do not load bitsandbytes"
NEEDS_CUDA = "a 4-bit bitsandbytes base (QLoRA) needs CUDA: estimate it with --device cuda"
BLOCKSIZE = 64  # bitsandbytes Params4bit's default block: one absmax per 64 elements
NESTED_BLOCKSIZE = 256  # double quant: quantize_blockwise(absmax - offset, blocksize=256)
# BitsAndBytesConfig.to_dict()'s keys; the int8 ones are accepted at their defaults (4-bit ignores them)
KNOWN_FIELDS = frozenset(
    {
        "quant_method",
        "load_in_4bit",
        "load_in_8bit",
        "_load_in_4bit",
        "_load_in_8bit",
        "llm_int8_threshold",
        "llm_int8_skip_modules",
        "llm_int8_enable_fp32_cpu_offload",
        "llm_int8_has_fp16_weight",
        "bnb_4bit_quant_type",
        "bnb_4bit_use_double_quant",
        "bnb_4bit_compute_dtype",
        "bnb_4bit_quant_storage",
    }
)


def _dtype(value: Any, allowed: tuple[str, ...], field: str, default: str) -> str:
    if value is None:
        return default
    name = str(value).removeprefix("torch.")
    if name not in allowed:
        raise InputError(field, f"must be one of {', '.join(allowed)}, got {value!r}")
    return name


@dataclass(frozen=True)
class QuantSpec:
    """A bitsandbytes 4-bit base: quant type, double quant, the packed data's storage dtype, the compute dtype,
    and the modules left unquantized (None: transformers' default choice)."""

    quant_type: str = "fp4"
    double_quant: bool = False
    storage: str = "uint8"
    compute_dtype: str = "float32"
    skip_modules: tuple[str, ...] | None = None

    @classmethod
    def of(cls, config: Any, field: str = "quantization") -> QuantSpec:
        """The spec of a ``quantization_config`` object; :class:`InputError` naming ``field.key`` otherwise."""
        if not isinstance(config, dict):
            raise InputError(field, "must be a JSON object (a BitsAndBytesConfig, as in config.json)")
        for key in config:
            if key not in KNOWN_FIELDS:
                raise InputError(f"{field}.{key}", "not a field of transformers' BitsAndBytesConfig")
        method = config.get("quant_method", "bitsandbytes")
        if method != "bitsandbytes":
            raise InputError(f"{field}.quant_method", f"only bitsandbytes is modelled, got {method!r}")
        if config.get("load_in_8bit") or config.get("_load_in_8bit"):
            raise InputError(f"{field}.load_in_8bit", "8-bit bitsandbytes is not modelled (4-bit QLoRA is)")
        if not (config.get("load_in_4bit") or config.get("_load_in_4bit")):
            raise InputError(f"{field}.load_in_4bit", "must be true (a 4-bit bitsandbytes base)")
        quant_type = config.get("bnb_4bit_quant_type") or "fp4"
        if quant_type not in QUANT_TYPES:
            raise InputError(f"{field}.bnb_4bit_quant_type", f"must be nf4 or fp4, got {quant_type!r}")
        double = config.get("bnb_4bit_use_double_quant", False)
        if not isinstance(double, bool):
            raise InputError(f"{field}.bnb_4bit_use_double_quant", "must be true or false")
        skip = config.get("llm_int8_skip_modules")
        if skip is not None and not (isinstance(skip, list) and all(isinstance(name, str) for name in skip)):
            raise InputError(f"{field}.llm_int8_skip_modules", "must be a list of module names")
        return cls(
            quant_type=quant_type,
            double_quant=double,
            storage=_dtype(
                config.get("bnb_4bit_quant_storage"), STORAGE_DTYPES, f"{field}.bnb_4bit_quant_storage", "uint8"
            ),
            compute_dtype=_dtype(
                config.get("bnb_4bit_compute_dtype"), COMPUTE_DTYPES, f"{field}.bnb_4bit_compute_dtype", "float32"
            ),
            skip_modules=None if skip is None else tuple(skip),
        )

    @classmethod
    def parse(cls, text: str) -> QuantSpec | None:
        """The spec of a canonical JSON text (``""``: no quantization)."""
        return cls.of(json.loads(text)) if text else None

    def canonical(self) -> str:
        """Canonical JSON of the fields that decide memory (fingerprints, cache keys)."""
        data = {
            "bnb_4bit_compute_dtype": self.compute_dtype,
            "bnb_4bit_quant_storage": self.storage,
            "bnb_4bit_quant_type": self.quant_type,
            "bnb_4bit_use_double_quant": self.double_quant,
            "llm_int8_skip_modules": None if self.skip_modules is None else list(self.skip_modules),
            "load_in_4bit": True,
            "quant_method": "bitsandbytes",
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def partitioned_by_zero3(self) -> bool:
        """DeepSpeed ZeRO-3 partitions the packed data only when it is a floating tensor (16/32-bit storage)."""
        return self.storage != "uint8"
