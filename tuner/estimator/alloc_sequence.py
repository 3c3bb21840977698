"""A plausible sequence of tensor allocations for one training step, built from an estimate's phases, for the
allocator simulation (:mod:`tuner.estimator.allocator`).

What is taken from the estimate: the bytes of each category in each phase (forward, backward, step), so the
sequence's live bytes follow the estimate's phases. What is assumed (not traced, not measured):

* Model states live from the start. Stage 0 allocates one tensor per parameter and two Adam moments per
  parameter (``model.to(device)`` and torch's per-parameter optimizer state; parameters under 1 MiB grouped until
  they reach it); stages 1-3 flatten them, so each category is one flat tensor (DeepSpeed's flat 16-bit buffer,
  fp32 master, moments).
* Forward, layer by layer: each layer's saved activations are tensors of the hidden-state size ``b·s·h·e`` (the
  last one the rest; at most :data:`MAX_TENSORS_PER_LAYER`, larger ones beyond that), and one transient of the
  MLP width ``b·s·f·e`` is allocated and freed per layer; ZeRO-3's gathered parameters are one tensor per layer;
  the logits workspace comes last.
* Backward, layers in reverse: the reduce buckets first (one tensor per copy), then per layer a transient
  gradient of the MLP width, the layer's share of the gradients, and the layer's activations freed; with
  checkpointing each layer's block is recomputed (allocated, then freed).
* Step: what the step phase holds beyond the backward phase (fp32 gradients) as one tensor, freed at the end.
* One micro-step, one stream (gradient accumulation and DeepSpeed's side streams are not replayed).

The reserve is sensitive to these choices (llama-2-7b ZeRO-1: reserved/allocated 1.046 with activations in at
most 4 tensors per layer, 1.195 with 8), which is why the GPU check (``bench/gpu_terms_check.py``) compares it with
``max_memory_reserved``.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from tuner.estimator.allocator import SMALL_SIZE, Event, OutOfMemory, Simulation, simulate

if TYPE_CHECKING:
    from tuner.estimator.phases import Phase
    from tuner.estimator.settings import Settings
    from tuner.workload import Workload

MAX_TENSORS_PER_LAYER = 4  # activations of one layer in at most this many tensors (keeps the simulation fast)


def _chunks(total: int, unit: int) -> list[int]:
    """``total`` bytes as tensors of ``unit`` bytes (at most :data:`MAX_TENSORS_PER_LAYER`) and a remainder."""
    if total <= 0:
        return []
    unit = max(unit, -(-total // MAX_TENSORS_PER_LAYER), 1)
    count, rest = divmod(total, unit)
    return [unit] * count + ([rest] if rest else [])


def _split(total: int, parts: int) -> list[int]:
    """``total`` bytes in ``parts`` near-equal pieces (no zero pieces)."""
    if total <= 0:
        return []
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._count = 0

    def alloc(self, size: int, prefix: str) -> str:
        self._count += 1
        name = f"{prefix}{self._count}"
        self.events.append(("alloc", name, size))
        return name

    def free(self, name: str) -> None:
        self.events.append(("free", name, 0))


class _Step(NamedTuple):
    """Everything the sequence depends on (hashable, so a sequence is built and simulated once per process)."""

    stage: int
    layers: int
    hidden: int  # bytes of one hidden-state tensor, b·s·h·e
    wide: int  # bytes of one MLP-width tensor, b·s·f·e
    numels: tuple[int, ...]  # per-parameter elements (stage 0 allocates them one by one), empty otherwise
    overlap_comm: bool
    steady: tuple[int, ...]  # by category (CATEGORY_ORDER): bytes alive in every phase
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    step: tuple[int, ...]
    logits: int
    working_set: int


CATEGORY_ORDER = ("parameters", "gradients", "optimizer_states", "activations", "buffers")


def simulated_step(
    workload: Workload,
    s: Settings,
    phases: dict[str, Phase],
    details: dict[str, int],
    expandable: bool = False,
    capacity: int | None = None,
) -> Simulation | None:
    """The allocator simulation of one step's plausible sequence (:func:`step_events`), cached per sequence; None
    when it runs out of ``capacity`` even after releasing the cache (as the real allocator would before raising)."""
    found = _simulated(_step_key(workload, s, phases, details), expandable, capacity)
    return None if found is None else replace(found)  # a copy: the cached one is shared


def step_events(workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int]) -> list[Event]:
    """The allocation sequence of one step on one rank's device (module docstring for what is assumed)."""
    return _events(_step_key(workload, s, phases, details))


def _step_key(workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int]) -> _Step:
    model, elem = workload.model, s.param_bytes
    fwd, bwd, step = (phases[name].gpu for name in ("forward", "backward", "step"))
    tokens = s.micro_batch * workload.train.seq_len // max(1, s.sequence_parallel_size)  # a rank's share
    return _Step(
        stage=s.stage,
        layers=max(1, model.num_layers or 1),
        hidden=tokens * max(model.hidden_size, 1) * elem,
        wide=tokens * max(model.intermediate_size or 4 * model.hidden_size, 1) * elem,
        numels=model.param_numels if s.stage == 0 and not model.is_bare else (),
        overlap_comm=s.overlap_comm,
        steady=tuple(min(fwd[name], bwd[name], step[name]) for name in CATEGORY_ORDER),
        forward=tuple(fwd[name] for name in CATEGORY_ORDER),
        backward=tuple(bwd[name] for name in CATEGORY_ORDER),
        step=tuple(step[name] for name in CATEGORY_ORDER),
        logits=details.get("logits_workspace", 0),
        working_set=details.get("stage3_working_set", 0),
    )


@functools.lru_cache(maxsize=4096)
def _simulated(key: _Step, expandable: bool, capacity: int | None) -> Simulation | None:
    try:
        return simulate(_events(key), expandable, capacity)
    except OutOfMemory:
        return None


class _Forward(NamedTuple):
    """What the forward pass leaves allocated: each layer's saved activations, the gathered parameters kept per
    layer (ZeRO-3), and the logits workspace."""

    activations: list[list[str]]
    kept: list[str]
    logits: str | None


def _forward(rec: _Recorder, key: _Step, steady: dict[str, int], fwd: dict[str, int]) -> _Forward:
    """Forward, layer by layer: the working set gathered and the MLP transient freed around each layer's saved
    activations and kept parameters, the logits workspace last."""
    layers, hidden, wide = key.layers, key.hidden, key.wide
    gathered = _split(fwd["parameters"] - steady["parameters"], layers)
    working_set = key.working_set
    activations: list[list[str]] = [[] for _ in range(layers)]
    kept: list[str] = []
    per_layer = _split(fwd["activations"] - steady["activations"], layers)
    for layer in range(layers):
        gather = rec.alloc(working_set, "gather") if working_set else None
        if layer < len(gathered):
            kept.append(rec.alloc(gathered[layer], "param"))
        temp = rec.alloc(wide, "mlp")
        size = per_layer[layer] if layer < len(per_layer) else 0
        activations[layer] = [rec.alloc(chunk, "act") for chunk in _chunks(size, hidden)]
        rec.free(temp)
        if gather:
            rec.free(gather)
    logits = rec.alloc(key.logits, "logits") if key.logits else None
    return _Forward(activations, kept, logits)


def _events(key: _Step) -> list[Event]:
    """One step's allocations and frees: model states, forward, backward in reverse layer order, the step."""
    steady, fwd, bwd, step = (
        dict(zip(CATEGORY_ORDER, values, strict=True)) for values in (key.steady, key.forward, key.backward, key.step)
    )
    layers, wide = key.layers, key.wide
    rec = _Recorder()
    _model_states(rec, key, steady)
    activations, kept, logits = _forward(rec, key, steady, fwd)

    bucket_bytes = bwd["buffers"] - steady["buffers"]
    buckets = [rec.alloc(size, "bucket") for size in _split(bucket_bytes, 2 if key.overlap_comm else 1)]
    if logits:
        rec.free(logits)
    grads: list[str] = []
    recompute = bwd["activations"] - steady["activations"]
    grad_sizes = _split(bwd["gradients"] - steady["gradients"], layers)
    for index, layer in enumerate(reversed(range(layers))):
        block = rec.alloc(recompute, "recompute") if recompute else None
        temp = rec.alloc(wide, "dmlp")
        if index < len(grad_sizes):
            grads.append(rec.alloc(grad_sizes[index], "grad"))
        rec.free(temp)
        if block:
            rec.free(block)
        for name in activations[layer]:
            rec.free(name)
        activations[layer] = []
        if kept:
            rec.free(kept.pop())
    for names in activations:
        for name in names:
            rec.free(name)
    for name in buckets if step["buffers"] <= steady["buffers"] else []:
        rec.free(name)

    kept_grads = bwd["gradients"] - steady["gradients"]
    step_grads = step["gradients"] - steady["gradients"]
    if step_grads < kept_grads:
        for name in grads:
            rec.free(name)
        grads, kept_grads = [], 0
    extra = [rec.alloc(step_grads - kept_grads, "step")] if step_grads > kept_grads else []
    for name in extra + grads:
        rec.free(name)
    return rec.events


def _grouped(numels: tuple[int, ...], total: int, nbytes: int) -> list[int]:
    """Parameters as the allocations the sequence makes: each of at least 1 MiB alone, consecutive smaller ones
    (norms, biases) together until they reach 1 MiB (they share the small pool's 2 MiB segments either way; fewer
    events keep the simulation fast)."""
    groups: list[int] = []
    small = 0
    for numel in numels:
        if nbytes * numel // total >= SMALL_SIZE:
            groups.append(numel)
            continue
        small += numel
        if nbytes * small // total >= SMALL_SIZE:
            groups.append(small)
            small = 0
    return groups + ([small] if small else [])


def _model_states(rec: _Recorder, key: _Step, steady: dict[str, int]) -> None:
    """What stays allocated through the step, allocated first (never freed)."""
    params, states = steady["parameters"], steady["optimizer_states"]
    numels = key.numels
    if numels and params:
        total = sum(numels) or 1
        groups = _grouped(numels, total, params)
        for numel in groups:
            rec.alloc(params * numel // total, "p")
        moments = min(states, 8 * total)
        for numel in groups:
            for _ in range(2):
                rec.alloc(moments * numel // (2 * total), "m")
        states -= moments
    elif params:
        rec.alloc(params, "flat")
    for size in _split(states, 3):
        rec.alloc(size, "opt")
    for name in ("gradients", "buffers", "activations"):
        if steady[name]:
            rec.alloc(steady[name], name)
