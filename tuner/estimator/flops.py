"""Model FLOPs per token and the dense peaks of known GPUs: one count for predicted and measured MFU (pure).

Example:
    >>> from tuner.workload import load_builtin_model
    >>> round(model_flops_per_token(load_builtin_model("gpt2"), 1024) / 1e9, 3)
    0.86
    >>> peak_tflops("NVIDIA H100 80GB HBM3"), peak_tflops("cpu")
    (989.0, None)
"""

from __future__ import annotations

from tuner.workload import ModelSpec

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}  # dense bf16, datasheets


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token: 6·N for the weights plus 12·L·h·s for attention scores (no recomputation)."""
    attention = 12 * model.num_layers * model.hidden_size * seq_len if not model.is_bare else 0
    return 6.0 * model.n_params + attention


def peak_tflops(device_name: str | None) -> float | None:
    """The dense bf16 peak of a known GPU, or None."""
    if not device_name:
        return None
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in device_name), None)
