"""What a rank's first optimizer step computed: its loss and DeepSpeed's global gradient norm.

These are what a numerics check compares between layouts (a wrong loss average under sequence parallelism shows in
the gradient norm even where the loss agrees). The gradient norm is DeepSpeed's own
(``engine.get_global_grad_norm()``, over every rank's gradient partitions, before clipping); the loss is the mean
of the step's micro-batch losses on this rank (under Ulysses the sequence-parallel group's mean, the same on each of
its ranks).
"""

from __future__ import annotations

from typing import Any


def first_step_numerics(engine: Any, losses: list[float]) -> dict[str, float | None]:
    """``{"loss": ..., "grad_norm": ...}`` of the optimizer step just taken, from its micro-batch ``losses``.

    >>> class Engine:
    ...     def get_global_grad_norm(self):
    ...         return 2.5
    >>> first_step_numerics(Engine(), [1.0, 3.0])
    {'loss': 2.0, 'grad_norm': 2.5}
    """
    norm = engine.get_global_grad_norm()
    if norm is not None and not isinstance(norm, float):
        norm = float(norm.item() if hasattr(norm, "item") else norm)
    return {"loss": sum(losses) / len(losses) if losses else None, "grad_norm": norm}


__all__ = ["first_step_numerics"]
