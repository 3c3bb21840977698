"""Host memory DeepSpeed 0.19 page-locks (pins), and what pinning costs on top of the buffer sizes.

Which host buffers are pinned (``deepspeed/runtime/zero/``, 0.19.8):

* ZeRO-1/2 with ``offload_optimizer`` and its ``pin_memory`` (default true): the fp32 master partition
  (``stage_1_and_2.py:564``), the 16-bit parameter copy-back buffer (``:571``), the largest-parameter gradient
  staging buffer (``:656``) and the fp32 gradient partition (``:940``). Adam's moments are created pageable.
* ZeRO-3 with ``offload_optimizer`` and its ``pin_memory``: the flat 16-bit gradient partition (``stage3.py:794``)
  and each sub-group's fp32 gradient buffer (``:1339``); the fp32 master and the moments are pageable.
* ZeRO-3 with ``offload_param`` on the CPU: the parameter shards move into one flat buffer per parameter group that
  is pinned whatever ``pin_memory`` says (``stage3.py:906``); the flag only pins the per-parameter shards
  ``zero.Init`` creates first (``partition_parameters.py:1842``), which that flat buffer replaces during
  ``deepspeed.initialize``. So ``offload_param.pin_memory`` does not change the steady state.
* NVMe swap buffers are always page-locked by the async I/O handle (``partitioned_param_swapper.py:131``), at their
  exact size.

Pinning a buffer costs more host memory than its size on CUDA hosts: ``Tensor.pin_memory()`` allocates from
PyTorch's caching host allocator, which rounds every request up to the next power of two by default
(``ATen/core/CachingHostAllocator.h``: ``PowerOf2Ceil`` below ``pinned_max_round_threshold``, unlimited unless
``PYTORCH_CUDA_ALLOC_CONF`` sets it), and page-locked memory cannot be swapped out. Pageable buffers
(``pin_memory: false``) cost their size. On CPU-only runs DeepSpeed's CPU accelerator makes ``pin_memory`` a no-op
(``accelerator/cpu_accelerator.py:283``): nothing is pinned or rounded there.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimator.terms import NOTHING, Contribution, Pinned


def power_of_two_ceil(size: int) -> int:
    """The smallest power of two at least ``size`` (0 stays 0), as PyTorch's host allocator rounds.

    Example:
        >>> power_of_two_ceil(3 * 2**20), power_of_two_ceil(4096), power_of_two_ceil(0)
        (4194304, 4096, 0)
    """
    return 1 << (size - 1).bit_length() if size > 0 else 0


@dataclass(slots=True)
class HostPins:
    """Tallies one term's pinned host bytes while it sizes its host buffers (its :meth:`contribution`).

    ``cuda``: the ranks run on CUDA devices (else pinning is a no-op). ``pinned``: page-locked bytes as allocated;
    ``rounding``: what the power-of-two rounding adds beyond the buffers' sizes (included in ``pinned``).

    Example:
        >>> pins = HostPins(cuda=True)
        >>> pins.size(3 * 2**20, pin=True), pins.size(3 * 2**20, pin=False), pins.pinned, pins.rounding
        (4194304, 3145728, 4194304, 1048576)
    """

    cuda: bool
    pinned: int = 0
    rounding: int = 0

    def size(self, nbytes: int, pin: bool, count: int = 1) -> int:
        """Host bytes ``count`` buffers of ``nbytes`` occupy, each pinned through ``Tensor.pin_memory()`` when
        ``pin``."""
        if not (pin and self.cuda):
            return count * nbytes
        held = count * power_of_two_ceil(nbytes)
        self.pinned += held
        self.rounding += held - count * nbytes
        return held

    def locked(self, nbytes: int) -> int:
        """Host bytes of a buffer page-locked at its exact size (DeepSpeed's async I/O swap buffers)."""
        self.pinned += nbytes
        return nbytes

    def contribution(self) -> Contribution:
        """What this tally adds to the estimate's pinned host bytes (:class:`.terms.Pinned`)."""
        return (Pinned(self.pinned, self.rounding),) if self.pinned else NOTHING
