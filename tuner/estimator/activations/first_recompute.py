"""The first recomputed layer's moment under activation checkpointing.

Backward starts at the last layer: its checkpoint is recomputed and its backward reaches its worst moment (the
estimate's ``recomputed_block``) while every other layer's checkpoint, its input (``e·b·s·h``, a rank's ``s/sp``
tokens), is still held: on the device, or with ALST's offloaded checkpoints only the next one being copied back. The
backward phase's activations are the recomputed layer's alone, so at this moment they are short of those
checkpoints; what the end of backward holds instead is the gradients that do not exist yet at its start (ZeRO 0-2:
the backward phase's gradients; ZeRO-3's partition is allocated before the first step). What the checkpoints are
beyond those gradients joins the backward phase's activations (``details["first_recompute_checkpoints"]``).

Measured (a transformers Llama, hidden 256, checkpointed, sequence 8,192, bf16, on CPU; peak live tensor bytes from
the counting allocator): 16 layers against 2 put the backward's peak 58.8 MB higher, 14 more checkpoints of 4.19 MB
each (58.7 MB); the estimate's backward activations did not move (``bench/results/first_recompute.md``).
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.estimator.layouts.ulysses import IN_FLIGHT_CHECKPOINTS, local_seq
from tuner.estimator.phases import Phase
from tuner.estimator.settings import Settings
from tuner.workload import Workload


def checkpoints_beside_first_recompute(workload: Workload, s: Settings) -> int:
    """Bytes of the other layers' checkpoints on the device while the last layer is recomputed (module docstring);
    0 without checkpointing."""
    if not s.activation_checkpointing:
        return 0
    model = workload.model
    checkpoint = s.param_bytes * s.micro_batch * local_seq(workload, s) * model.hidden_size
    others = IN_FLIGHT_CHECKPOINTS - 1 if s.offload_checkpoints else max(1, model.num_layers) - 1
    return others * checkpoint


def first_recompute_extra(workload: Workload, s: Settings, phases: Mapping[str, Phase]) -> int:
    """What the first recomputed layer's moment holds beyond the backward phase's end (module docstring): the other
    checkpoints, less the gradients the end holds and the start does not."""
    absent = phases["backward"].gpu["gradients"] if s.stage < 3 else 0
    return max(0, checkpoints_beside_first_recompute(workload, s) - absent)


__all__ = ["checkpoints_beside_first_recompute", "first_recompute_extra"]
