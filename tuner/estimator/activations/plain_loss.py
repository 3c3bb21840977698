"""The loss's workspace of dstune's ``nn.MultiheadAttention`` transformer (:mod:`tuner.profile.mha_transformer`):
``cross_entropy(logits.view(-1, vocab), labels.view(-1))`` in the logits' own dtype, where Hugging Face's loss upcasts
the logits to fp32 first (:func:`tuner.estimator.activations.saved.logits_workspace_bytes`).

The trace counts the log-softmax the loss saves; beyond it, the start of backward holds the gradients of the
log-softmax's output and input, each in the log-softmax's dtype ``d``: the training dtype, or fp32 under
``torch_autocast`` (``log_softmax`` and ``nll_loss`` run fp32 under CUDA's and CPU's autocast alike), so
``2·d·b·s·V``. Measured: a plain PyTorch forward and backward on CPU with the counting allocator (vocabulary 4,096,
seq 512, bf16) peaks ``2·2·bsV`` above the saved tensors and the logits, ``2·4·bsV`` under autocast; on 2 CPU
ranks at ZeRO-3 the estimate meets the true peak (``bench/results/mha_true_peak.md``). A training loop that keeps
the logits until backward (the example's ``logits = model_engine(input_ids)``) holds ``e·bsV`` more.
"""

from __future__ import annotations

from tuner.estimator.activations.saved import logits_workspace_bytes
from tuner.workload import ModelSpec

PLAIN_LOSS_FAMILIES = frozenset({"mha_transformer"})
FP32 = 4


def loss_workspace(model: ModelSpec, batch: int, seq: int, elem: int, autocast: str) -> int:
    """Bytes around the loss beyond its saved tensors: for a model whose loss runs in the logits' dtype (module
    docstring), else Hugging Face's (:func:`logits_workspace_bytes`)."""
    if model.family not in PLAIN_LOSS_FAMILIES:
        return logits_workspace_bytes(model, batch, seq, elem)
    dtype = FP32 if autocast else elem
    return 2 * dtype * batch * seq * model.vocab_size
