"""Bytes per element of the optimizer's master partition, its gradient and Adam's moments, as DeepSpeed 0.19.8's ZeRO
optimizers allocate them with and without ``bf16.bf16_master_weights_and_grads`` and ``bf16.bf16_optimizer_states``
(:class:`tuner.workload.Numerics` checks which combinations DeepSpeed takes).

* The master partition is created in ``master_weights_and_grads_dtype`` (``stage_1_and_2.py:560``, ``stage3.py``
  ``_create_fp32_partitions``): fp32, or bf16 with the first option. ZeRO-3 compares the 16-bit shard's device with
  the device *name* (a string, never equal to a ``torch.device``), so it always copies: a bf16 master is a second
  bf16 copy of the shard, not the shard itself.
* The gradient the step reads is in the master's dtype: ZeRO-1/2 ``flat_grad_partition.to(master dtype)`` (a bf16
  master takes the bf16 flat partition itself, no copy), ZeRO-3's sub-group gradient buffer, and with offload the
  host gradient partition (``stage_1_and_2.py:938``, ``stage3.py`` ``_create_fp16_sub_groups``' buffers).
* Adam's two moments follow the master (FusedAdam ``zeros_like``): bf16 with both options; with optimizer offload
  DeepSpeedCPUAdam keeps them fp32 unless ``bf16_optimizer_states`` builds it with ``fp32_optimizer_states=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimator.settings import FP32, Settings

BF16 = 2
ADAM_MOMENTS = 2  # Adam's exp_avg and exp_avg_sq per element


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per element: the master partition (and the gradient the step reads), and Adam's moments together."""

    master: int = FP32
    moments: int = ADAM_MOMENTS * FP32

    @property
    def states(self) -> int:
        """Master plus moments: what ``optimizer_states`` holds per element of the partition."""
        return self.master + self.moments


def state_bytes(s: Settings) -> StateBytes:
    """The master's and moments' bytes per element for ``s``.

    Example:
        >>> from dataclasses import replace
        >>> from tuner.estimator.settings import Settings
        >>> from tuner.workload import ParallelLayout, Ranks
        >>> base = Settings(2, 1, 1, 4, "bf16", 2, True, True, 1, 1, "none", True, 4, "none", True, 5, 1, 1, 1, 1,
        ...                 1, 1, 1, ParallelLayout(), Ranks(2))
        >>> state_bytes(base).states, state_bytes(replace(base, bf16_master=True)).states
        (12, 10)
        >>> state_bytes(replace(base, bf16_master=True, bf16_optimizer_states=True)).states
        6
    """
    if not s.bf16_master:
        return StateBytes()
    return StateBytes(BF16, ADAM_MOMENTS * (BF16 if s.bf16_optimizer_states else FP32))


__all__ = ["BF16", "StateBytes", "state_bytes"]
