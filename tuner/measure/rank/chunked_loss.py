"""DeepSpeed's chunked cross-entropy on a measured rank (``dstune.chunked_loss``): the same loss in fp32 without the
``[tokens, vocab]`` fp32 tensors Hugging Face's loss makes (``deepspeed/runtime/chunked_cross_entropy.py``).

A transformers model gets DeepSpeed's own ``install_chunked_causal_lm_loss`` (its stock ``ForCausalLMLoss``
replaced); the built-in model calls ``chunked_cross_entropy`` on its logits instead of ``F.cross_entropy``. The loss
of a tiled loss or Ulysses (:class:`tuner.measure.rank.layouts.ulysses.LongContextLM`) is its own: not combined.
"""

from __future__ import annotations

from typing import Any


def use_chunked_loss(model: Any) -> None:
    """Make ``model`` (a :class:`~tuner.measure.rank.models.TransformersCausalLM` or built-in
    :class:`~tuner.measure.rank.models.CausalLM`) compute its training loss with DeepSpeed's chunked cross-entropy.

    Raises:
        ValueError: the model's loss is not one this replaces (a transformers model without the stock loss).
    """
    from deepspeed.runtime.chunked_cross_entropy import install_chunked_causal_lm_loss

    from tuner.measure.rank.models import CausalLM

    if isinstance(model, CausalLM):
        model.chunked_loss = True
        return
    install_chunked_causal_lm_loss(model.model)


__all__ = ["use_chunked_loss"]
