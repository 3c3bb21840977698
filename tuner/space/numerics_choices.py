"""The choices that change a training's numerics or its loss's code path, as search-space parameters: bf16 master
weights and gradients, bf16 optimizer states, the Muon optimizer and DeepSpeed's chunked cross-entropy
(:mod:`tuner.workload.numerics`). A study offers them only when the user allows it (``tune
--allow-numerics-changes``): :func:`with_numerics_choices` adds them to a loaded space then, and a space without them
is the space as loaded, every parameter and config unchanged.

Each is offered only where DeepSpeed 0.19.8 takes it and the estimator models it:

* ``bf16_master_weights`` (``bf16.bf16_master_weights_and_grads``): bf16 training at ZeRO 1-3;
  ``bf16_optimizer_states`` beside it. Without the states DeepSpeed keeps the fp32 moments on the host through
  DeepSpeedCPUAdam only, so such a trial without optimizer offload is pruned, the reason naming the key.
* ``muon`` (``optimizer.type: Muon``): ZeRO-1/2 without optimizer offload, AutoTP or AutoEP, the whole model
  trained, a model whose shapes are known (the Muon/Adam split is read from them).
* ``chunked_loss`` (``dstune.chunked_loss``): dstune's own trainer (a training command's loss is its own), without a
  tiled loss or Ulysses (their loss is their own).

Example:
    >>> from tuner.space import default_space_path, load_space
    >>> from tuner.workload import Workload, load_builtin_model
    >>> space = load_space(default_space_path())
    >>> added = with_numerics_choices(space, Workload(load_builtin_model("tiny-llama")))
    >>> [name for name in added.names if name not in space.names]
    ['bf16_master_weights', 'bf16_optimizer_states', 'muon', 'chunked_loss']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.space.conditions import WORKLOAD_FACTS
from tuner.space.facts import workload_facts
from tuner.space.loader import load_space
from tuner.space.parameter_entry import parse_parameter, parse_when
from tuner.space.parameters import Parameter
from tuner.space.space import SearchSpace
from tuner.workload import Workload, WorkloadError
from tuner.workload.layouts import AUTOEP, AUTOTP, ULYSSES, LayoutKind
from tuner.workload.numerics import MASTER_KEY, STATES_KEY

SOURCE = "--allow-numerics-changes"


def _off(kind: LayoutKind) -> tuple[str, str]:
    """The clause that the layout ``kind`` is off (its space parameter at 1)."""
    return kind.field, f"{kind.field} == 1"


# name -> (entry without `when`, the `when` clauses as (the parameter each tests, the clause)); a clause on a
# parameter the space lacks, or on one that cannot apply to the workload and whose default satisfies it, is left
# out (:func:`_may_apply`); a clause on a workload fact (None) is always kept
ENTRIES: dict[str, tuple[dict[str, Any], tuple[tuple[str | None, str], ...]]] = {
    "bf16_master_weights": (
        {"choices": [None, True], "key": MASTER_KEY, "help": "bf16 master weights and gradients (changes numerics)"},
        (("stage", "stage >= 1"),),
    ),
    "bf16_optimizer_states": (
        {"choices": [True, None], "key": STATES_KEY, "help": "bf16 optimizer states (changes numerics)"},
        (("bf16_master_weights", "bf16_master_weights == true"),),
    ),
    "muon": (
        {"choices": [None, "Muon"], "key": "optimizer.type", "help": "Muon for the matrices (changes numerics)"},
        (
            ("stage", "stage in [1, 2]"),
            ("offload_optimizer", "offload_optimizer == none"),
            _off(AUTOTP),
            _off(AUTOEP),
            (None, "frozen_params == 0"),
        ),
    ),
    "chunked_loss": (
        {"choices": [None, True], "key": "dstune.chunked_loss", "help": "DeepSpeed's chunked cross-entropy loss"},
        (_off(ULYSSES), ("tiled_loss_shards", "tiled_loss_shards == 1")),
    ),
}
NUMERICS_PARAMETERS = tuple(ENTRIES)


def offered(workload: Workload, script: bool = False) -> tuple[str, ...]:
    """The numerics parameters a study of ``workload`` can offer (``script``: a training command's study).

    >>> from tuner.workload import TrainSpec, model_from_param_count
    >>> offered(Workload(model_from_param_count(1e9), train=TrainSpec(precision="fp16")))
    ('chunked_loss',)
    """
    names = []
    if workload.train.precision == "bf16":
        names += ["bf16_master_weights", "bf16_optimizer_states"]
    if not workload.model.is_bare and workload.trainable.is_full:
        names.append("muon")
    if not script:
        names.append("chunked_loss")
    return tuple(names)


def with_numerics_choices(space: SearchSpace, workload: Workload, script: bool = False) -> SearchSpace:
    """``space`` with the numerics parameters ``workload`` can take added after its own (a ZeRO stage parameter is
    needed for all but the chunked loss); a name or key the space already has is left to the space's own parameter.
    Pins and frozen names are the space's (apply pins of the added parameters afterwards)."""
    parameters: list[Parameter] = list(space.parameters)
    keys = {parameter.key for parameter in parameters if parameter.key}
    facts = _facts(workload)
    for name in offered(workload, script):
        entry, clauses = ENTRIES[name]
        present = {parameter.name for parameter in parameters}
        if name in present or entry["key"] in keys or ("stage" not in present and name != "chunked_loss"):
            continue
        if any(tested in ENTRIES and tested not in present for tested, _ in clauses):
            continue  # its master switch was not added
        when = [
            clause
            for tested, clause in clauses
            if tested is None or (tested in present and _may_apply(tested, clause, parameters, facts, space.pins))
        ]
        spec = {"kind": "categorical", "default": None, **entry, **({"when": when} if when else {})}
        parameters.append(parse_parameter(name, spec, parameters, SOURCE))
    return SearchSpace(parameters, space.base, space.source, space.pins)


def _facts(workload: Workload) -> dict[str, int] | None:
    """The workload's facts, None where they need a profile it lacks (every clause is kept then)."""
    try:
        return workload_facts(workload)
    except WorkloadError:
        return None


def _may_apply(
    tested: str, clause: str, parameters: list[Parameter], facts: dict[str, int] | None, pins: dict[str, Any]
) -> bool:
    """Whether the clause on the parameter ``tested`` is kept: it is, unless that parameter can never be active for
    this workload (its own conditions name only workload facts and fail; not pinned) and its default satisfies the
    clause. An inactive parameter never satisfies a clause (:meth:`Condition.holds`), so a clause such as
    ``tensor_parallel == 1`` kept on a workload that AutoTP does not apply to would never offer the choice."""
    parameter = next(p for p in parameters if p.name == tested)
    if facts is None or tested in pins or not parameter.when:
        return True
    if any(not c.names <= set(WORKLOAD_FACTS) for c in parameter.when):
        return True
    if parameter.active(facts):
        return True
    (condition,) = parse_when(clause, f"{SOURCE}.when", parameters, SOURCE)
    return not condition.holds({tested: parameter.default})


def numerics_pins(pins: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``pins`` split into the space file's and the numerics parameters' (applied once those are added).

    >>> numerics_pins({"stage": 1, "bf16_master_weights": True})
    ({'stage': 1}, {'bf16_master_weights': True})
    """
    keys = {entry["key"]: name for name, (entry, _) in ENTRIES.items()}
    own = {name: value for name, value in pins.items() if name in ENTRIES or name in keys}
    return {name: value for name, value in pins.items() if name not in own}, own


def load_study_space(
    path: str | Path, pins: dict[str, Any], workload: Workload, allowed: bool, script: bool = False
) -> SearchSpace:
    """A study's space: the space file with ``pins``, and with ``allowed`` (``--allow-numerics-changes``) the numerics
    choices too, their own pins applied once they are there.

    Raises:
        SpaceError: As :func:`tuner.space.load_space`; a numerics pin without ``allowed`` names no parameter.
    """
    own, numerics = numerics_pins(pins) if allowed else (pins, {})
    space = load_space(path, pins=own)
    return with_numerics_choices(space, workload, script).with_pins(numerics) if allowed else space


__all__ = ["NUMERICS_PARAMETERS", "load_study_space", "numerics_pins", "offered", "with_numerics_choices"]
