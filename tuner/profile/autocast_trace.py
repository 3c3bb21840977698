"""The trace's forward pass under ``torch.autocast`` as a ds_config's ``torch_autocast`` runs it
(:mod:`tuner.workload.autocast`), on CPU tensors with CUDA's autocast policy where the run is on CUDA. Imports torch.

The trace runs on (fake) CPU tensors, and a whole model cannot be traced on fake CUDA ones (autograd aborts the
process, :mod:`tuner.estimator.attention`), so CPU autocast runs it. CPU's autocast policy differs from CUDA's: CUDA
runs the norms, softmaxes and the ops listed below in fp32 (their outputs fp32, saved as such) and a few more
matrix products in 16 bits, where CPU leaves them in their input's dtype. :func:`cuda_policy` registers, for the
time of the trace, CPU autocast kernels that apply CUDA's casts for those ops (PyTorch's ``autocast_mode.cpp``
CUDA lists, those CPU's lists lack). Autocast runs above autograd, so the casts are recorded and what each op saves
is the cast tensor, as on CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tuner.profile.hf import TORCH_DTYPES
from tuner.workload.autocast import split_trace_precision

# torch 2.13's CUDA autocast: ops cast to fp32 and to the 16-bit dtype (only those CPU's policy does not already cast)
CUDA_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow", "softplus", "layer_norm", "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "softmax", "log_softmax", "cumprod", "cumsum", "sum", "prod", "norm",
)  # fmt: skip
CUDA_LOWER = ("addmv", "addr", "einsum", "mv", "chain_matmul", "linalg_multi_dot")
AUTOCAST_CPU = torch._C.DispatchKey.AutocastCPU


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """``value`` cast to ``dtype`` where it is a floating tensor (or a list of them) of another floating dtype other
    than fp64, as autocast's ``cached_cast`` casts."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype not in (dtype, torch.float64):
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _kernel(op: Any, dtype: torch.dtype) -> Callable[..., Any]:
    """An autocast kernel running ``op`` with its floating arguments cast to ``dtype``, below autocast."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(AUTOCAST_CPU)):
            return op(*_cast(args, dtype), **{key: _cast(value, dtype) for key, value in kwargs.items()})

    return run


def _qualified(name: str, overload: str) -> str:
    return name if overload == "default" else f"{name}.{overload}"


def _needs_kernel(name: str, overload: str) -> bool:
    """Whether ``aten::name.overload`` is a dispatcher operator (not an ``out=`` variant or a Python-level
    ``int``/``float`` one) that CPU's own autocast policy leaves alone."""
    if "out" in overload:
        return False
    try:
        return not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_qualified(name, overload)}", AUTOCAST_CPU)
    except RuntimeError:  # no such dispatcher operator
        return False


@contextlib.contextmanager
def cuda_policy(lower: torch.dtype) -> Iterator[None]:
    """CPU autocast with CUDA's casts for :data:`CUDA_FP32` and :data:`CUDA_LOWER` (to ``lower``), until exit."""
    library = torch.library.Library("aten", "IMPL")
    try:
        for names, dtype in ((CUDA_FP32, torch.float32), (CUDA_LOWER, lower)):
            for name in names:
                packet = getattr(torch.ops.aten, name)
                for overload in packet.overloads():
                    if _needs_kernel(name, overload):
                        kernel = _kernel(getattr(packet, overload), dtype)
                        library.impl(_qualified(name, overload), kernel, "AutocastCPU")
        yield
    finally:
        library._destroy()


@contextlib.contextmanager
def traced_autocast(key: str) -> Iterator[None]:
    """The forward passes inside run under the autocast of trace precision ``key`` (none without one)."""
    _, device, dtype = split_trace_precision(key)
    if not dtype:
        yield
        return
    lower = TORCH_DTYPES[dtype]
    with contextlib.ExitStack() as stack:
        if device == "cuda":
            stack.enter_context(cuda_policy(lower))
        stack.enter_context(torch.autocast("cpu", dtype=lower))
        yield
