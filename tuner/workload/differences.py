"""What tells rows of a table apart: the settings in which they differ, beyond what the table's columns show.

A table of trials (``dstune tune``'s top configs, the dashboard's trials) or of workloads (the dashboard's home) shows
a few fields in columns; two rows that differ only elsewhere (a bucket size, ``overlap_comm``, the precision) would
print as the same row. :func:`differing_keys` finds the settings whose values are not the same in every row, and
:func:`describe_differences` says a row's values of them, so every row reads as what it is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from tuner.workload.layouts import LAYOUTS
from tuner.workload.long_context import long_context_config
from tuner.workload.numerics import numerics_config
from tuner.workload.trial import PRECISION_SECTIONS, TrialConfig

# the prefixes left out of a setting's name where the rest names it alone (DeepSpeed's own key names remain)
SHORT_PREFIXES = ("zero_optimization.", "dstune.")
WORKLOAD_PREFIXES = ("model.", "cluster.", "train.", "trainable.")
CHECKPOINTING = "activation_checkpointing"  # a trial's setting outside its ds_config
# the settings every view of a trial names: ZeRO stage, batch shape, offload devices, activation checkpointing
COLUMN_KEYS = (
    "zero_optimization.stage",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",  # micro × accumulation × the data-parallel ranks
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_param.device",
    CHECKPOINTING,
)


def flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping's leaves under dotted keys (an empty section is a leaf).

    >>> flat({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}, "gradient_clipping": 1.0})
    {'zero_optimization.stage': 2, 'zero_optimization.offload_param.device': 'cpu', 'gradient_clipping': 1.0}
    """
    leaves: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping) and value:
            leaves.update(flat(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def trial_settings(config: TrialConfig) -> dict[str, Any]:
    """A trial's settings as one flat mapping: its ds_config's leaves and its activation checkpointing."""
    return {**flat(config.ds_config), CHECKPOINTING: config.activation_checkpointing}


def layout_keys() -> frozenset[str]:
    """The settings of the parallel layouts (each kind of :data:`~tuner.workload.layouts.LAYOUTS`, with what it
    writes beside its degree) and of ALST's tiling and checkpoint offload: what a table's layout column shows."""
    keys = set(flat(long_context_config(2, 2, 2, offload_checkpoints=True)))
    for kind in LAYOUTS:
        keys |= set(flat(kind.config(2)))
    return frozenset(keys)


def summary_keys() -> frozenset[str]:
    """The settings :meth:`TrialConfig.summary` names: :data:`COLUMN_KEYS`, the precision, the numerics choices and
    the layouts (:func:`layout_keys`)."""
    numerics = flat(numerics_config(True, True, "muon", chunked_loss=True, liger=True))
    precision = {f"{section}.enabled" for section in PRECISION_SECTIONS}
    return frozenset({*COLUMN_KEYS, *numerics, *precision, *layout_keys()})


def workload_settings(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored workload's settings as one flat mapping: its peft adapter's fields each a setting, ``trainable=all
    parameters`` for full fine-tuning (its stored form has no trainable part), without unset (empty) fields and without
    its launch environment (said apart, its variables' values private).

    >>> workload_settings({"train": {"seq_len": 64}, "trainable": {"peft": '{"r": 8}', "freeze": ""}})
    {'train.seq_len': 64, 'trainable.peft.r': 8}
    >>> workload_settings({"train": {"seq_len": 64}})
    {'train.seq_len': 64, 'trainable': 'all parameters'}
    """
    data = {key: value for key, value in stored.items() if key != "launch"}
    trainable = data.get("trainable")
    if isinstance(trainable, Mapping) and isinstance(trainable.get("peft"), str) and trainable["peft"]:
        with contextlib.suppress(ValueError):
            data["trainable"] = {**trainable, "peft": json.loads(trainable["peft"])}
    leaves = {key: value for key, value in flat(data).items() if value != ""}
    return leaves if "trainable" in data else {**leaves, "trainable": "all parameters"}


def _covered(key: str, shown: Collection[str]) -> bool:
    return any(key == name or key.startswith(f"{name}.") for name in shown)


def differing_keys(rows: Sequence[Mapping[str, Any]], shown: Collection[str] = ()) -> list[str]:
    """The keys whose values are not the same in every row (a key a row does not set differs from any value), in
    the order they first appear, leaving out those ``shown`` (a shown key covers the keys under it).

    >>> differing_keys([{"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5}], shown=("c",))
    ['b']
    """
    missing = object()
    keys = dict.fromkeys(key for row in rows for key in row)
    return [key for key in keys if not _covered(key, shown) and len({repr(row.get(key, missing)) for row in rows}) > 1]


def short_name(key: str, prefixes: Sequence[str] = SHORT_PREFIXES) -> str:
    """A setting's name in a table: its dotted key without the section that goes without saying.

    >>> short_name("zero_optimization.offload_param.pin_memory"), short_name("dstune.chunked_loss")
    ('offload_param.pin_memory', 'chunked_loss')
    """
    for prefix in prefixes:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def format_value(value: Any) -> str:
    """A setting's value as a table shows it: DeepSpeed's words for booleans and none, counts of a million and more
    to three significant digits (``5e8``, ``1.06e8``: enough to tell apart; ``dstune best`` exports them exactly).

    >>> format_value(500_000_000), format_value(106_452_590), format_value(True), format_value(None), format_value(0.5)
    ('5e8', '1.06e8', 'true', 'null', '0.5')
    >>> format_value(["q_proj", "v_proj"])
    '[q_proj, v_proj]'
    """
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list | tuple):  # a list of names: [q_proj, v_proj]
        return f"[{', '.join(map(format_value, value))}]"
    if isinstance(value, int) and abs(value) >= 10**6:
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return str(value)


def describe_differences(row: Mapping[str, Any], keys: Iterable[str], prefixes: Sequence[str] = SHORT_PREFIXES) -> str:
    """A row's values of ``keys`` (those it sets): ``reduce_bucket_size=5e8 · overlap_comm=false``.

    >>> describe_differences({"zero_optimization.overlap_comm": False, "x": 1}, ["zero_optimization.overlap_comm"])
    'overlap_comm=false'
    """
    return " · ".join(f"{short_name(key, prefixes)}={format_value(row[key])}" for key in keys if key in row)


__all__ = [
    "CHECKPOINTING",
    "COLUMN_KEYS",
    "WORKLOAD_PREFIXES",
    "describe_differences",
    "differing_keys",
    "flat",
    "format_value",
    "layout_keys",
    "short_name",
    "summary_keys",
    "trial_settings",
    "workload_settings",
]
