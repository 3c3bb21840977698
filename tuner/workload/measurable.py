"""What makes a workload impossible to measure before any rank starts (``dstune tune``, ``dstune measure`` and the
API's tuning jobs share it): a 4-bit bitsandbytes base, a bare parameter count, and a sequence longer than the
model's learned position table (every step would index past it)."""

from __future__ import annotations

from tuner.workload.quantization import MEASURED_QUANTIZATION
from tuner.workload.spec import Workload


def measurement_refusal(workload: Workload) -> tuple[str, str] | None:
    """``(field, reason)`` when no run of ``workload`` can train, else None.

    Example:
        >>> from tuner.workload import ClusterSpec, TrainSpec, load_builtin_model
        >>> tiny = load_builtin_model("tiny-gpt2")
        >>> measurement_refusal(Workload(tiny, ClusterSpec(device="cpu"), TrainSpec(seq_len=2048)))
        ... # doctest: +ELLIPSIS
        ('seq-len', '2048 tokens is longer than the 256 positions tiny-gpt2 learned ...')
        >>> measurement_refusal(Workload(tiny, ClusterSpec(device="cpu"), TrainSpec(seq_len=256))) is None
        True
    """
    model = workload.model
    if workload.trainable.quantization:
        return "quantization", MEASURED_QUANTIZATION
    if model.is_bare:
        return "params", "a measured run needs a model architecture: use --model"
    beyond = beyond_positions(workload)
    return ("seq-len", beyond) if beyond else None


def beyond_positions(workload: Workload) -> str:
    """Why no run can train the workload at its length (``""``: one can): the sequence is longer than the model's
    learned position table (GPT-2's ``wpe``, OPT's, the RoPE-less models'), which, unlike rotary positions, no
    scaling extends. An estimate of it is an estimate only (:func:`tuner.estimator.states.quantized.estimate_only_why`).

    >>> from tuner.workload import ClusterSpec, TrainSpec, load_builtin_model
    >>> tiny = load_builtin_model("tiny-gpt2")
    >>> beyond_positions(Workload(tiny, ClusterSpec(), TrainSpec(seq_len=256)))
    ''
    """
    model, seq_len = workload.model, workload.train.seq_len
    limit = model.position_limit
    if 0 < limit < seq_len:
        return (
            f"{seq_len} tokens is longer than the {limit} positions {model.name} learned (its position embedding "
            f"table): every step would index past it; use --seq-len {limit} or less"
        )
    return ""


__all__ = ["beyond_positions", "measurement_refusal"]
