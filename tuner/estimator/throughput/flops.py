"""Model FLOPs per token and the dense peaks of known GPUs: one count for predicted and measured MFU (pure).

Example:
    >>> from tuner.workload import load_builtin_model
    >>> round(model_flops_per_token(load_builtin_model("gpt2"), 1024) / 1e9, 3)
    0.86
    >>> lora = model_flops_per_token(load_builtin_model("gpt2"), 1024, trainable=1_000_000)
    >>> round(lora / model_flops_per_token(load_builtin_model("gpt2"), 1024), 3)
    0.713
    >>> peak_tflops("NVIDIA H100 80GB HBM3"), peak_tflops("cpu")
    (989.0, None)
"""

from __future__ import annotations

from tuner.workload import GPU_TYPES, ModelSpec

# dense bf16 (fp16 on a V100), datasheets: markers of device names, then the GPU types (tuner.workload.GPU_TYPES)
PEAK_TFLOPS = {
    **{"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0},
    **{"RTX 3090": 71.0, "RTX 4090": 165.2, "V100": 125.0},
    **{name: gpu.peak_tflops for name, gpu in GPU_TYPES.items()},
}


def _passes(model: ModelSpec) -> tuple[float, int]:
    """(weights one token multiplies through, decoder-layer runs): N and L, except for a looped model, whose looped
    layers run more than once (:attr:`ModelSpec.layer_passes`), each run taken as an average layer's weights (the
    non-embedding parameters over L)."""
    layers, passes = model.num_layers, model.layer_passes
    if model.is_bare or passes == layers or not layers:
        return float(model.n_params), layers
    embeddings = model.vocab_size * model.hidden_size * (1 if model.tie_embeddings else 2)
    per_layer = max(0, model.n_params - embeddings) / layers
    return model.n_params + (passes - layers) * per_layer, passes


def forward_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2·N for the weights plus 4·L·h·s for the attention scores (what a recomputed forward
    costs again under activation checkpointing); a looped model's layers count once per run (:func:`_passes`)."""
    weights, passes = _passes(model)
    attention = 4 * passes * model.hidden_size * seq_len if not model.is_bare else 0
    return 2.0 * weights + attention


def backward_flops_per_token(model: ModelSpec, seq_len: int, trainable: int | None = None) -> float:
    """Backward FLOPs per token: gradients of the activations through every layer (2·N, twice the forward's
    attention scores) and of the weights that train (2·T; T = N when ``trainable`` is None).

    With LoRA or frozen layers the backward pass still flows through the frozen weights to reach the adapters, so
    only the weight-gradient half shrinks: 4·N + 2·T in all instead of 6·N (a small error below the lowest trainable
    layer, where activation gradients are not needed either)."""
    through, passes = _passes(model)
    attention = 8 * passes * model.hidden_size * seq_len if not model.is_bare else 0
    weights = through if trainable is None else trainable
    return 2.0 * through + 2.0 * weights + attention


def model_flops_per_token(model: ModelSpec, seq_len: int, trainable: int | None = None) -> float:
    """Training FLOPs per token: 6·N for the weights plus 12·L·h·s for attention scores (no recomputation); with
    ``trainable`` parameters (LoRA, frozen layers) 4·N + 2·T for the weights (:func:`backward_flops_per_token`)."""
    return forward_flops_per_token(model, seq_len) + backward_flops_per_token(model, seq_len, trainable)


def peak_tflops(device_name: str | None) -> float | None:
    """The dense bf16 peak of a known GPU, or None."""
    if not device_name:
        return None
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in device_name), None)
