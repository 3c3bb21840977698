"""A measured run's numerics: its step-0 loss and global gradient norm, and the losses after, on seeded data.

Every run of a workload trains on the same global batch: sample ``i`` of it is drawn from its own seed
(:func:`step_samples`, :func:`seeded_batches`), whatever the micro-batch × accumulation × data-parallel split, so in
exact arithmetic every config with the same global batch starts from the same loss and the same gradient: the
built-in and transformers models average the loss over a micro-batch's tokens (all samples have the same number of
targets), DeepSpeed divides each micro-batch's loss by the accumulation steps (``engine.backward(scale_wrt_gas=True)``)
and averages gradients over the data-parallel ranks; dropout, whose masks are drawn per micro-batch call, is held
for step 0 (:mod:`tuner.measure.rank.dropout_hold`; ``step0_dropout_held``: how many sites). The study compares
these figures with its reference run (:mod:`tuner.study.numerics_guard`).

The gradient norm is DeepSpeed's own (``engine.get_global_grad_norm()``, read after the first optimizer step, i.e.
the first accumulation boundary): the fp32 norm of the reduced, unclipped gradient that ZeRO-1/2
(``stage_1_and_2.scaled_global_norm``), ZeRO-3 (``combine_grad_norm_groups``) and the bf16 optimizer of ZeRO-0
(``BF16_Optimizer``) compute in ``step`` and keep as ``_global_grad_norm``, on CPU as on CUDA. ZeRO-0 in fp32 wraps
no optimizer (the engine's stays None): there the norm is DeepSpeed's ``get_global_norm_of_tensors`` over the
parameters' gradients after the boundary's backward (averaged over the ranks by then), before the step.

Fault injection: ``dstune.fault_loss_scale`` in a trial's ds_config (:attr:`TrialConfig.fault_loss_scale`, for tests
only) multiplies the loss each rank backpropagates, a broken loss average; the loss it reports is the model's, so
only the gradient shows it, as with a sequence-parallel loss reduced the wrong way for its ZeRO stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.measure.rank.dropout_hold import DropoutHold
from tuner.workload import ModelSpec, TrialConfig

DATA_SEED = 20_261_202  # sample i of a step's global batch is drawn from DATA_SEED + i


def step_samples(feeder: int, feeders: int, micro: int, accum: int) -> list[list[int]]:
    """The global-batch sample indices that data feeder ``feeder`` of ``feeders`` trains on, per micro-step.

    A feeder is a data-parallel rank (all ranks of one sequence- or tensor-parallel group share one). Every sample
    of the ``micro × accum × feeders`` global batch is trained on exactly once:

    >>> step_samples(1, 2, 2, 2)
    [[2, 3], [6, 7]]
    >>> sorted(i for f in range(2) for m in step_samples(f, 2, 2, 2) for i in m) == list(range(8))
    True
    """
    return [[(step * feeders + feeder) * micro + j for j in range(micro)] for step in range(accum)]


def feeder_of(rank: int, world: int, trial: TrialConfig) -> tuple[int, int]:
    """This rank's data feeder and the number of feeders: DeepSpeed groups a sequence- or tensor-parallel group's
    ranks consecutively, so the data-parallel index is the rank over sp × tp.

    >>> feeder_of(3, 4, TrialConfig({"sequence_parallel_size": 2}))
    (1, 2)
    """
    ranks = trial.layout.ranks(world).checked()
    return ranks.place(rank).data_parallel, ranks.data_parallel


def seeded_batches(
    spec: ModelSpec, seq_len: int, micro: int, accum: int, feeder: tuple[int, int], device: Any
) -> list[Any]:
    """One (tokens, targets) batch per micro-step of an optimizer step for ``feeder`` (index, count): each sample's
    ``seq_len + 1`` token ids drawn from its own seed (:data:`DATA_SEED` + its global index)."""
    import torch

    batches = []
    for samples in step_samples(feeder[0], feeder[1], micro, accum):
        rows = [
            torch.randint(0, spec.vocab_size, (seq_len + 1,), generator=torch.Generator().manual_seed(DATA_SEED + i))
            for i in samples
        ]
        tokens = torch.stack(rows)
        batches.append((tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)))
    return batches


def own_grad_norm(engine: Any) -> float | None:
    """The global gradient norm where DeepSpeed keeps none (ZeRO-0 in fp32: no wrapping optimizer): DeepSpeed's
    ``get_global_norm_of_tensors`` over the gradients, called after the boundary's backward and before the step.
    None where DeepSpeed's optimizer computes it itself."""
    if hasattr(engine.optimizer, "_global_grad_norm"):
        return None
    from deepspeed.runtime.utils import get_global_norm_of_tensors

    grads = [param.grad for param in engine.module.parameters() if param.grad is not None]
    return float(get_global_norm_of_tensors(grads, mpu=engine.mpu)) if grads else None


def first_step_numerics(step_losses: Sequence[Sequence[Any]], grad_norm: float | None) -> dict[str, Any]:
    """The run's numerics from this rank's loss tensors (one list of micro-batch losses per optimizer step, warm-up
    and timed steps alike) and the step-0 global gradient norm: each step's loss is the mean over its micro-batches,
    then over every rank (one all-reduce, so every rank returns the same figures; under sequence or tensor
    parallelism each rank's loss is its share's or its group's mean, and the mean over all ranks is still the
    global batch's).

    Returns:
        ``step0_loss``, ``step0_grad_norm`` (None if DeepSpeed computed none: ``compute_grad_norm: false``) and
        ``losses`` (every optimizer step's, step 0 first).
    """
    import torch
    import torch.distributed as dist

    means = [torch.stack([loss.detach().float().cpu() for loss in step]).mean() for step in step_losses if step]
    if not means:
        return {}
    total = torch.stack(means).double()
    world = 1
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        device = step_losses[0][0].device
        reduced = total.to(device)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)  # gloo has no AVG
        total = reduced.cpu()
    losses = (total / world).tolist()
    return {"step0_loss": losses[0], "step0_grad_norm": grad_norm, "losses": losses}


class NumericsRecorder:
    """Collects a rank's losses and its step-0 gradient norm while it trains: :meth:`start_step` at each optimizer
    step, :meth:`backward_loss` per micro-batch, :meth:`before_step` before the boundary's ``engine.step()`` and
    :meth:`after_step` after it. Step 0 trains with the model's dropout held (:mod:`tuner.measure.rank.dropout_hold`:
    every mask all ones), so that its figures do not depend on how the global batch is split."""

    def __init__(self, trial: TrialConfig) -> None:
        self.scale = trial.fault_loss_scale
        self.step_losses: list[list[Any]] = []
        self.grad_norm: float | None = None
        self._own: float | None = None
        self.dropout = DropoutHold()

    def start_step(self, engine: Any) -> None:
        """An optimizer step begins (step 0: with ``engine``'s model's dropout held)."""
        self.step_losses.append([])
        if len(self.step_losses) == 1:
            self.dropout.hold(engine.module)

    def backward_loss(self, loss: Any) -> Any:
        """Record ``loss`` (a micro-batch's) and return what to backpropagate (scaled by the fault switch)."""
        self.step_losses[-1].append(loss.detach())
        return loss * self.scale if self.scale != 1.0 else loss

    def before_step(self, engine: Any) -> None:
        """Before the first optimizer step: the gradient norm where DeepSpeed keeps none."""
        if len(self.step_losses) == 1:
            self._own = own_grad_norm(engine)

    def after_step(self, engine: Any) -> None:
        """After the first optimizer step: its gradient norm (DeepSpeed's, else :func:`own_grad_norm`'s)."""
        if len(self.step_losses) == 1:
            self.dropout.release()
            norm = engine.get_global_grad_norm()
            self.grad_norm = float(norm) if norm is not None else self._own

    def numerics(self) -> dict[str, Any]:
        """:func:`first_step_numerics` of what was recorded (a collective: every rank calls it)."""
        found = first_step_numerics(self.step_losses, self.grad_norm)
        return {**found, "step0_dropout_held": self.dropout.sites} if found else found
