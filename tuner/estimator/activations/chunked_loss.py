"""DeepSpeed's chunked cross-entropy (``dstune.chunked_loss``, ``deepspeed/runtime/chunked_cross_entropy.py``) at the
loss's moment, in place of Hugging Face's loss.

Hugging Face's loss upcasts the ``[tokens, vocab]`` logits to fp32 and saves the fp32 log-softmax for backward
(the ``4·N·V`` the model's saved activations count, traced or by formula), and its backward makes two more fp32
tensors of that size (the estimate's logits workspace, :func:`.activations.logits_workspace_bytes`). The chunked
loss saves the 16-bit logits it was given and one fp32 log-sum-exp per token, and works through the rows in
blocks of ``r = 2^26 // V`` rows (``_block_rows``):

* PyTorch's backend (CPU, and CUDA without Triton): forward holds the logits and two fp32 blocks (the upcast block
  and ``logsumexp``'s temporary, or the previous block beside the next); backward holds the logits, their
  gradient (``empty_like``) and two fp32 blocks (``x - lse`` and its ``exp``), three from the second block on (the
  previous block's probabilities are still bound while the next is computed). Backward is the larger:
  ``2·e·N·V + k·4·r·V`` (``k`` = 2 with one block, 3 with more; ``r`` at most the tokens).
* The Triton backend (CUDA with Triton, DeepSpeed's ``auto`` choice there): one read of the logits per pass, no
  block: ``2·e·N·V``.

Measured on CPU with the counting allocator (a 1-layer LLaMA, bf16): at 1,024 tokens and V = 65,536 (one block)
12.05 and 12.05 bytes per logit for the two losses, at 8,192 tokens and V = 16,384 (two blocks) 12.19 with
Hugging Face's and 10.19 with the chunked loss; the 0.05-0.19 is the layers' saved activations.
"""

from __future__ import annotations

from tuner.estimator.settings import FP32

BLOCK_ELEMENTS = 1 << 26  # deepspeed.runtime.chunked_cross_entropy._BLOCK_ELEMENTS
TOKEN_BYTES = 4 + 8 + 1  # what it saves per token: the fp32 log-sum-exp, the int64 target, the valid flag


def block_rows(vocab: int) -> int:
    """Rows per block of the PyTorch backend (``_block_rows``).

    >>> block_rows(65536), block_rows(151936)
    (1024, 441)
    """
    return max(1, BLOCK_ELEMENTS // vocab)


def chunked_loss_terms(tokens: int, vocab: int, elem: int, device: str) -> tuple[int, int]:
    """(saved bytes the chunked loss changes, its workspace at the loss's moment) for ``tokens`` rows of ``vocab``
    logits in ``elem`` bytes: the saved change drops the fp32 log-softmax Hugging Face's loss saves and adds the
    per-token vectors; the workspace replaces the logits workspace.

    >>> chunked_loss_terms(8192, 16384, 2, "cpu")[1] == 2 * 2 * 8192 * 16384 + 3 * 4 * 4096 * 16384
    True
    """
    saved = TOKEN_BYTES * tokens - FP32 * tokens * vocab
    workspace = 2 * elem * tokens * vocab
    if device != "cuda":  # PyTorch's backend, block by block
        rows = min(block_rows(vocab), tokens)
        workspace += (3 if tokens > rows else 2) * FP32 * rows * vocab
    return saved, workspace


__all__ = ["block_rows", "chunked_loss_terms"]
