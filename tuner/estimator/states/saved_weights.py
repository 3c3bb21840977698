"""ZeRO-3 with torch's own ``F.linear``: the gathered weights autograd keeps from forward to backward.

``nn.Linear`` runs ``addmm(bias, input, weight.t())`` (``matmul`` for 3-D inputs), and autograd saves ``weight.t()``
for the input's gradient: a *view* of the gathered weight. ZeRO-3 releases a parameter by giving it a new, empty
storage (``param.data = ...``), which frees the gathered one only if nothing else refers to it; the saved view does.
So every Linear's whole 16-bit weight stays allocated from its forward until its backward, on every rank: a whole
model's Linears at the end of forward. DeepSpeed avoids it with ``LinearFunctionForZeroStage3``, which saves the
parameter itself (``memory_efficient_linear``, on by default) -- but it replaces ``F.linear`` only inside
``deepspeed.zero.Init``: a script that builds its model outside it and hands it to ``deepspeed.initialize`` (as
DeepSpeedExamples' ``training/bf16_master_weight/train.py`` does) runs torch's own, as does
``zero_optimization.memory_efficient_linear: false``; say so with the latter. With activation checkpointing the
blocks save nothing in forward (one recomputed block's weights, already gathered, in backward). GPT-2's ``Conv1D``
runs ``addmm(bias, x, weight)``, saving the parameter itself: nothing held.

The weights are the entries of the model's parameter counts of a Linear's size
(:func:`tuner.estimator.layouts.autotp.linear_sizes`) and an untied LM head; those ZeRO-3 keeps gathered after
forward anyway (``gathered_parameters``) are the same storages, counted once.
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.estimator.layouts.autotp import linear_sizes
from tuner.estimator.settings import Settings
from tuner.estimator.terms import NOTHING, Contribution, detail, held
from tuner.workload import Workload

SAVES_PARAMETER = frozenset({"gpt2"})  # families whose projections (Conv1D) save the parameter, not a view of it


def held_weight_elements(workload: Workload) -> int:
    """Elements of the Linear weights whose gathered storage a saved ``weight.t()`` keeps (module docstring)."""
    model = workload.model
    if model.family in SAVES_PARAMETER:
        return 0
    sizes = linear_sizes(model)
    head = 0 if model.tie_embeddings else model.vocab_size * model.hidden_size
    return sum(numel for numel in model.param_numels if numel in sizes) + head


def saved_weight_views(workload: Workload, s: Settings, recorded: Mapping[str, int]) -> Contribution:
    """At ZeRO-3 without the memory-efficient linear nor checkpointing: the Linears' whole weights held at the end of
    forward (beyond the parameters ``recorded`` kept gathered) and at the start of backward."""
    if s.stage != 3 or s.zero_ranks < 2 or s.memory_efficient_linear or s.activation_checkpointing:
        return NOTHING  # on one rank the shard is the whole parameter: nothing gathered (:mod:`.stage3_gathered`)
    size = s.param_bytes * held_weight_elements(workload)
    if not size:
        return NOTHING
    beyond = max(0, size - recorded.get("gathered_parameters", 0))
    return (
        detail("saved_weight_views", size)
        + held("gpu", "parameters", beyond, ("forward",))
        + held("gpu", "parameters", size, ("backward",))
    )
