"""Dropout held for step 0: every dropout site of the model keeps dropping with a probability so small that each
mask is all ones, so step 0's loss and gradient are functions of the weights and the global batch alone.

Why. Dropout draws one mask per call from the RNG, over the whole micro-batch tensor: the same global batch split
4 × 1 or 1 × 4 trains through other masks. On the README's LoRA example (``lora_dropout`` 0.05: the adapter's
``B`` starts at zero, so the loss is the same and only the gradient of ``B`` sees the masks) the step-0 gradient
norm moved 2.0-2.5e-2 between splits in fp32 as in bf16, and 0 (fp32) and 1.4e-4 (bf16) with the dropout at 0
(``bench/results/numerics_noise_tiny-llama_lora.md``). The numerics guard compares runs of different splits, so step
0 must not depend on the masks.

How. The probability becomes :data:`HELD_P` (1e-300) instead of 0: torch's dropout returns its input unchanged at
exactly 0 (no mask, no copy) and SDPA may pick another kernel, which would change step 0's memory and time; at
1e-300, ``1 - p`` rounds to 1.0 in double, so the same kernels run, allocate and save the same tensors, every mask
is all ones and the scale ``1 / (1 - p)`` is 1.0. Sites: every ``torch.nn`` dropout module (``nn.Dropout``, peft's
``lora_dropout``, GPT-2's), and every float attribute named ``*dropout`` that transformers' attention modules pass
to SDPA (``attention_dropout``). From step 1 on each site has its own probability back.
"""

from __future__ import annotations

from typing import Any

HELD_P = 1e-300


def _sites(model: Any) -> list[tuple[Any, str, float]]:
    """(module, attribute, probability) for each dropout site with a probability above 0."""
    from torch.nn.modules.dropout import _DropoutNd

    found = []
    for module in model.modules():
        if isinstance(module, _DropoutNd):
            if module.p > 0:
                found.append((module, "p", float(module.p)))
            continue
        for name, value in vars(module).items():
            if name.endswith("dropout") and isinstance(value, float) and value > 0:
                found.append((module, name, value))
    return found


class DropoutHold:
    """Holds a model's dropout sites at :data:`HELD_P` between :meth:`hold` and :meth:`release`."""

    def __init__(self) -> None:
        self._held: list[tuple[Any, str, float]] = []
        self.sites = 0

    def hold(self, model: Any) -> int:
        """Set every dropout site of ``model`` to :data:`HELD_P`; returns how many there are."""
        self._held = _sites(model)
        for module, name, _ in self._held:
            setattr(module, name, HELD_P)
        self.sites = len(self._held)
        return self.sites

    def release(self) -> None:
        """Give each held site its own probability back."""
        for module, name, probability in self._held:
            setattr(module, name, probability)
        self._held = []


__all__ = ["HELD_P", "DropoutHold"]
