"""Which parameters DeepSpeed's AutoTP shards, read from the built transformers model's own ``tp_plan`` as DeepSpeed
0.19.8 reads it (imports nothing heavy; called on the model :mod:`tuner.profile.hf` builds on ``meta``).

DeepSpeed merges the config's ``base_model_tp_plan``, the class's ``_tp_plan`` and the instance's
(``runtime/tensor_parallel/config.py`` ``_get_hf_tp_plan``; a ``model.``-prefixed pattern once), turns each pattern
into a regular expression matched anywhere in a weight's name (``module_inject/tp_plan_converter.py``: ``.`` literal,
``*`` any run, ``.*`` before, ``\\.weight$`` after) and shards the matched Linears: ``colwise`` (and
``colwise_gather_output``, ``colwise_rep``) by output rows, the bias with them; ``rowwise`` by input columns, the
bias whole (added once after the all-reduce). ``embedding_rowwise`` and ``replicated_with_grad_allreduce`` stay whole;
a style outside these makes DeepSpeed reject the whole plan. A weight tied to the embedding is listed once, as the
embedding, and stays whole. Measured: a tiny Phi (biased q, k, v, dense, fc1, fc2 and LM head) with AutoTP 2 holds
987,264 elements a rank, what this mask gives (``bench/tp_true_peak.py``).
"""

from __future__ import annotations

import re
from typing import Any

COLUMN = ("colwise", "colwise_rep", "colwise_gather_output")
ROW = ("rowwise",)
WHOLE = ("embedding_rowwise", "replicated_with_grad_allreduce")


def merged_plan(model: Any) -> dict[str, str]:
    """The model's tp_plan as DeepSpeed merges it (config, class, instance); empty when it has none."""
    config = getattr(model, "config", None)
    plans = (
        getattr(config, "base_model_tp_plan", None),
        getattr(type(model), "_tp_plan", None),
        vars(model).get("_tp_plan"),
    )
    merged: dict[str, str] = {}
    seen: set[str] = set()
    for plan in plans:
        for pattern, style in (plan or {}).items() if isinstance(plan, dict) else ():
            canonical = pattern.removeprefix("model.")
            if pattern.startswith("model.") and canonical in seen:
                continue
            merged[pattern] = style
            seen.add(canonical)
    return merged


def _weight_regex(pattern: str) -> re.Pattern[str]:
    """DeepSpeed's ``TPPlanConverter._wildcard_to_regex`` with its ``.weight`` suffix."""
    regex = ".*" + pattern.replace(".", r"\.").replace("*", ".*")
    return re.compile(regex + (r"$" if regex.endswith(r"\.weight") else r"\.weight$"))


def autotp_sharded(model: Any) -> tuple[bool, ...]:
    """For each of ``model``'s parameters (tied ones once, in order), whether AutoTP shards it; empty when the model
    has no plan, or one DeepSpeed rejects (then AutoTP is refused or falls back to name heuristics)."""
    plan = merged_plan(model)
    styles = {style.lower() for style in plan.values()}
    if not plan or not styles <= {*COLUMN, *ROW, *WHOLE}:
        return ()
    column = [_weight_regex(p) for p, style in plan.items() if style.lower() in COLUMN]
    row = [_weight_regex(p) for p, style in plan.items() if style.lower() in ROW]
    sharded = []
    for name, _ in model.named_parameters():
        weight = name[: -len("bias")] + "weight" if name.endswith(".bias") else name
        is_column = any(regex.match(weight) for regex in column)
        sharded.append(is_column or (weight == name and any(regex.match(name) for regex in row)))
    return tuple(sharded)


__all__ = ["autotp_sharded", "merged_plan"]
