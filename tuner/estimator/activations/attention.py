"""What PyTorch's CUDA attention kernels save for backward beyond what the CPU-traced or formula activations count.

PyTorch's fused CUDA SDPA kernels save the output, an fp32 log-sum-exp and the dropout RNG state. Their shapes,
read from the kernels' meta functions under ``FakeTensorMode`` with fake CUDA tensors on the CPU wheel (torch
2.13.0+cpu, B=2, H=4, D=64):

* flash (16-bit, head dim <= 256, sm80+): output, log-sum-exp ``[B, H, S]`` fp32, RNG state ``(2,)`` and ``()``
  uint64;
* memory-efficient (fp32, or head dim > 256): output, log-sum-exp ``[B, H, ceil(S/32)·32]`` fp32 (S=100 gives 128,
  S=1000 gives 1024), seed and offset ``()`` int64;
* cuDNN: output, log-sum-exp ``[B, H, S, 1]`` fp32, seed and offset ``()`` int64.

The CPU traces (:mod:`tuner.profile`) and the formulas (:mod:`tuner.estimator.activations.saved`) already count the
output and an unpadded fp32 log-sum-exp (CPU's flash path saves the same), so a CUDA run adds the log-sum-exp's
padding (memory-efficient kernel) and the RNG tensors, each one 512 B allocator block. Small, but named.

A whole model cannot be traced with fake CUDA tensors on a CPU wheel: creating them works, but autograd aborts the
process (``c10::Error: PyTorch is not linked with support for cuda devices`` from ``InputMetadata``, uncatchable)
as soon as a fake CUDA tensor requires grad, and ``F.scaled_dot_product_attention`` on fake CUDA tensors takes the
math path (no CUDA kernel choice on a CPU build). So this is analytic.
"""

from __future__ import annotations

from tuner.workload import ModelSpec

FLASH_MAX_HEAD_DIM = 256
LSE_PAD = 32  # the memory-efficient kernel pads the log-sum-exp's sequence axis to a multiple of 32
BLOCK = 512  # the caching allocator's smallest block: each RNG scalar takes one


def kernel(model: ModelSpec, precision: str, attention: str) -> str:
    """The CUDA SDPA kernel PyTorch picks for a causal, unmasked training call: ``flash``, ``efficient`` or
    ``none`` (eager attention, or no attention shapes known)."""
    if attention == "eager" or not model.num_heads:
        return "none"
    head_dim = model.head_dim or model.hidden_size // model.num_heads
    return "efficient" if precision == "fp32" or head_dim > FLASH_MAX_HEAD_DIM else "flash"


def extra_bytes_per_layer(model: ModelSpec, batch: int, seq: int, precision: str, attention: str) -> int:
    """Bytes one layer's CUDA attention saves beyond the CPU-traced activations (module docstring).

    Example:
        >>> from tuner.workload import load_builtin_model
        >>> llama = load_builtin_model("llama-2-7b")
        >>> extra_bytes_per_layer(llama, 1, 1000, "fp32", "sdpa")  # 32 heads × 24 padded positions × 4 B + RNG
        4096
        >>> extra_bytes_per_layer(llama, 1, 1024, "bf16", "sdpa")  # flash: the RNG tensors' two blocks
        1024
    """
    chosen = kernel(model, precision, attention)
    if chosen == "none":
        return 0
    rng = 2 * BLOCK
    if chosen == "flash":
        return rng
    padded = -(-seq // LSE_PAD) * LSE_PAD
    return 4 * batch * model.num_heads * (padded - seq) + rng
