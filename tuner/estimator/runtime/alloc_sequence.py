"""A plausible sequence of tensor allocations for one training step, built from an estimate's phases, for the
allocator simulation (:mod:`tuner.estimator.runtime.allocator`).

What is taken from the estimate: the bytes of each category in each phase (forward, backward, step). Each phase's
worst moment in the sequence holds the bytes the estimate's phase holds, never more (the estimate's phases are the
step's high-water marks, each with its own transients): the sequence's peak of allocated bytes is the estimate's
peak phase. What is assumed (not traced, not measured):

* Model states live from the start. Stage 0 allocates one tensor per parameter and two Adam moments per
  parameter (``model.to(device)`` and torch's per-parameter optimizer state; parameters under 1 MiB grouped until
  they reach it); stages 1-3 flatten them, so each category is one flat tensor (DeepSpeed's flat 16-bit buffer,
  fp32 master, moments).
* Forward, layer by layer: each layer's saved activations are tensors of the hidden-state size ``b·s·h·e`` (the
  last one the rest; at most :data:`MAX_TENSORS_PER_LAYER`, larger ones beyond that), and one transient of the
  MLP width ``b·s·f·e`` (a tiled MLP's shard of it) is allocated and freed per layer; ZeRO-3's gathered parameters
  are one tensor per layer; the logits workspace comes last, then what else the forward phase holds.
* Backward, layers in reverse: what only the forward's moment held is freed, and the saved activations beyond the
  backward phase's (last layers first: backward consumed them); the backward phase's activations count the saved
  ones still alive, so the recomputed block is what it holds beyond them. Then the reduce buckets (one tensor per
  copy), and per layer the block (allocated, then freed), a transient of the MLP width, the layer's gradients (in
  pieces, as its activations) and the layer's activations freed.
* A transient never takes the phase above its total, nor grows past the phase's first (the room consumed tensors
  leave later is not filled by larger temporaries).
* Step: what the step phase holds beyond the backward's (fp32 gradients, moments created at the first step),
  one tensor per category, freed at the end.
* One micro-step, one stream (gradient accumulation and DeepSpeed's side streams are not replayed).

The reserve is sensitive to these choices (llama-2-7b ZeRO-1: reserved/allocated 1.046 with activations in at
most 4 tensors per layer, 1.195 with 8; allocating backward's activations on top of forward's still held put ALST's
Llama-8B at 500K tokens at 111.9 GiB simulated against a 71.8 GiB peak), which is why the GPU check
(``bench/gpu_terms_check.py``) compares it with ``max_memory_reserved``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from tuner.estimator.runtime.allocator import SMALL_SIZE, Event, OutOfMemory, Simulation, simulate

if TYPE_CHECKING:
    from tuner.estimator.phases import Phase
    from tuner.estimator.settings import Settings
    from tuner.workload import Workload

MAX_TENSORS_PER_LAYER = 4  # activations of one layer in at most this many tensors (keeps the simulation fast)
CATEGORY_ORDER = ("parameters", "gradients", "optimizer_states", "activations", "buffers")


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
    """The events of one sequence, with the bytes alive in total and by category (:data:`CATEGORY_ORDER`, or
    ``transient`` for what a phase allocates and frees within a moment)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._count = 0
        self._sizes: dict[str, tuple[int, str]] = {}
        self.live = 0
        self.by_category: dict[str, int] = dict.fromkeys(CATEGORY_ORDER, 0)
        self._largest: dict[int, int] = {}  # a phase's (by its envelope) first transient

    def alloc(self, size: int, prefix: str, category: str = "transient") -> str:
        self._count += 1
        name = f"{prefix}{self._count}"
        self.events.append(("alloc", name, size))
        self._sizes[name] = (size, category)
        self.live += size
        if category in self.by_category:
            self.by_category[category] += size
        return name

    def free(self, name: str) -> None:
        self.events.append(("free", name, 0))
        size, category = self._sizes.pop(name)
        self.live -= size
        if category in self.by_category:
            self.by_category[category] -= size

    def names(self, category: str) -> list[str]:
        """The tensors of ``category`` alive now."""
        return [name for name, (_, held) in self._sizes.items() if held == category]

    def transient(self, size: int, prefix: str, envelope: int) -> str | None:
        """A temporary of at most ``size`` bytes that keeps the bytes alive within ``envelope`` (the phase's total:
        the estimate's phases already hold their worst moments), never larger than the phase's first (the room that
        consumed tensors leave later is not taken by larger temporaries), or None when nothing is left."""
        size = min(size, envelope - self.live, self._largest.get(envelope, size))
        if size <= 0:
            return None
        self._largest[envelope] = size
        return self.alloc(size, prefix)

    def top_up(self, target: dict[str, int], prefix: str) -> list[str]:
        """One tensor per category for what ``target`` holds beyond the bytes alive in it."""
        return [
            self.alloc(target[name] - self.by_category[name], f"{prefix}-{name}-", name)
            for name in CATEGORY_ORDER
            if target[name] > self.by_category[name]
        ]


class _Step(NamedTuple):
    """Everything the sequence depends on (hashable, so a sequence is built and simulated once per process)."""

    stage: int
    layers: int
    hidden: int  # bytes of one hidden-state tensor, b·s·h·e
    wide: int  # bytes of one MLP-width tensor, b·s·f·e (a tiled MLP's shard of it)
    numels: tuple[int, ...]  # per-parameter elements (stage 0 allocates them one by one), empty otherwise
    overlap_comm: bool
    steady: tuple[int, ...]  # by category (CATEGORY_ORDER): bytes alive in every phase
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    step: tuple[int, ...]
    logits: int
    working_set: int


def simulated_step(
    workload: Workload,
    s: Settings,
    phases: Mapping[str, Phase],
    details: Mapping[str, int],
    expandable: bool = False,
    capacity: int | None = None,
) -> Simulation | None:
    """The allocator simulation of one step's plausible sequence (:func:`step_events`), cached per sequence; None
    when it runs out of ``capacity`` even after releasing the cache (as the real allocator would before raising)."""
    found = _simulated(_step_key(workload, s, phases, details), expandable, capacity)
    return None if found is None else replace(found)  # a copy: the cached one is shared


def step_events(
    workload: Workload, s: Settings, phases: Mapping[str, Phase], details: Mapping[str, int]
) -> list[Event]:
    """The allocation sequence of one step on one rank's device (module docstring for what is assumed)."""
    return _events(_step_key(workload, s, phases, details))


def _step_key(workload: Workload, s: Settings, phases: Mapping[str, Phase], details: Mapping[str, int]) -> _Step:
    model, elem = workload.model, s.param_bytes
    fwd, bwd, step = (phases[name].gpu for name in ("forward", "backward", "step"))
    tokens = s.micro_batch * workload.train.seq_len // max(1, s.ranks.sequence)  # a rank's share
    return _Step(
        stage=s.stage,
        layers=max(1, model.num_layers or 1),
        hidden=tokens * max(model.hidden_size, 1) * elem,
        wide=tokens * max(model.intermediate_size or 4 * model.hidden_size, 1) * elem // max(1, s.tiled_mlp_shards),
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
    layer (ZeRO-3), and what only the forward's moment holds (the logits workspace, the rest of its phase)."""

    activations: list[list[str]]
    kept: list[str]
    moment: list[str]


def _forward(rec: _Recorder, key: _Step, steady: dict[str, int], fwd: dict[str, int]) -> _Forward:
    """Forward, layer by layer: the working set gathered and the MLP transient freed around each layer's saved
    activations and kept parameters, the logits workspace last, then the rest of the forward phase's bytes."""
    layers, hidden, wide = key.layers, key.hidden, key.wide
    envelope = sum(fwd.values())
    gathered = _split(fwd["parameters"] - steady["parameters"], layers)
    activations: list[list[str]] = [[] for _ in range(layers)]
    kept: list[str] = []
    per_layer = _split(fwd["activations"] - steady["activations"], layers)
    for layer in range(layers):
        gather = rec.transient(key.working_set, "gather", envelope) if key.working_set else None
        if layer < len(gathered):
            kept.append(rec.alloc(gathered[layer], "param", "parameters"))
        temp = rec.transient(wide, "mlp", envelope)
        size = per_layer[layer] if layer < len(per_layer) else 0
        activations[layer] = [rec.alloc(chunk, "act", "activations") for chunk in _chunks(size, hidden)]
        for name in (temp, gather):
            if name:
                rec.free(name)
    logits = min(key.logits, fwd["buffers"] - rec.by_category["buffers"])  # the phase's buffers at the loss
    moment = [rec.alloc(logits, "logits", "buffers")] if logits > 0 else []
    return _Forward(activations, kept, moment + rec.top_up(fwd, "forward"))


def _events(key: _Step) -> list[Event]:
    """One step's allocations and frees: model states, forward, backward in reverse layer order, the step. Each
    phase's worst moment holds the bytes the estimate's phase does, never more: backward consumes the forward's
    saved activations (its phase counts those still alive), transients fit within their phase's total."""
    steady, fwd, bwd, step = (
        dict(zip(CATEGORY_ORDER, values, strict=True)) for values in (key.steady, key.forward, key.backward, key.step)
    )
    rec = _Recorder()
    _model_states(rec, key, steady)
    forward = _forward(rec, key, steady, fwd)
    held = _backward(rec, key, bwd, forward)
    for name in held if step["buffers"] < rec.by_category["buffers"] else []:
        rec.free(name)
    if step["gradients"] < rec.by_category["gradients"]:
        for name in rec.names("gradients"):
            rec.free(name)
    for name in rec.top_up(step, "step"):
        rec.free(name)
    return rec.events


def _backward(rec: _Recorder, key: _Step, bwd: dict[str, int], forward: _Forward) -> list[str]:
    """Backward, layers in reverse: what only the forward's moment held freed, the saved activations beyond the
    backward phase's freed last layer first (backward consumed them), the buckets, then per layer the recomputed
    block (the backward's activations beyond those still saved), a transient, the layer's gradients, the layer's
    activations and kept parameters freed. Returns the buckets."""
    activations, kept = forward.activations, forward.kept
    for name in forward.moment:
        rec.free(name)
    layers = list(reversed(range(key.layers)))
    for layer in layers:
        if rec.by_category["activations"] <= bwd["activations"]:
            break
        for name in activations[layer]:
            rec.free(name)
        activations[layer] = []
    while kept and rec.by_category["parameters"] > bwd["parameters"]:
        rec.free(kept.pop())
    envelope = sum(bwd.values())
    buckets = [
        rec.alloc(size, "bucket", "buffers")
        for size in _split(bwd["buffers"] - rec.by_category["buffers"], 2 if key.overlap_comm else 1)
    ]
    extra = rec.top_up({**rec.by_category, "parameters": bwd["parameters"]}, "backward")
    recompute = bwd["activations"] - rec.by_category["activations"]
    grad_sizes = _split(bwd["gradients"] - rec.by_category["gradients"], key.layers)
    for index, layer in enumerate(layers):
        block = rec.alloc(recompute, "recompute", "activations") if recompute > 0 else None
        temp = rec.transient(key.wide, "dmlp", envelope)
        for chunk in _chunks(grad_sizes[index], key.hidden) if index < len(grad_sizes) else []:
            rec.alloc(chunk, "grad", "gradients")  # a layer's gradients in pieces, as its activations
        for done in (temp, block, *activations[layer]):
            if done:
                rec.free(done)
        activations[layer] = []
        if kept:
            rec.free(kept.pop())
    for name in extra:
        rec.free(name)
    return buckets


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
            rec.alloc(params * numel // total, "p", "parameters")
        moments = min(states, 8 * total)
        for numel in groups:
            for _ in range(2):
                rec.alloc(moments * numel // (2 * total), "m", "optimizer_states")
        states -= moments
    elif params:
        rec.alloc(params, "flat", "parameters")
    for size in _split(states, 3):
        rec.alloc(size, "opt", "optimizer_states")
    for name in ("gradients", "buffers", "activations"):
        if steady[name]:
            rec.alloc(steady[name], name, name)
