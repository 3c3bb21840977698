"""Declarative search spaces: YAML files in ``search_spaces/`` turned into DeepSpeed configs from an Optuna trial.

Pure Python: the only third-party import is PyYAML. Optuna is never imported here; :meth:`SearchSpace.suggest` takes
any object with Optuna's ``suggest_categorical`` / ``suggest_int`` / ``suggest_float`` methods.

File format
-----------
A space file is a YAML mapping with these top-level fields (no others)::

    version: 1                      # optional; only 1 exists
    description: ZeRO settings      # optional
    base:                           # optional: a ds_config fragment every trial starts from
      optimizer: {params: {lr: 1.0e-4}}
      gradient_clipping: 1.0
    parameters:                     # name -> spec, in order; names are identifiers
      stage:
        kind: categorical           # categorical | int | float
        choices: [0, 1, 2, 3]       # categorical only: scalars (null, bool, int, float, string)
        key: zero_optimization.stage  # the dotted ds_config key the value is written to
        default: 0                  # required: the value when not searched (DeepSpeed's default where it has one)
      reduce_bucket_size:
        kind: int
        low: 10_000_000             # int/float: low and high required, inclusive
        high: 1_000_000_000
        log: true                   # optional: log scale (needs low > 0; no step with log)
        step: 1                     # optional: the grid step (int >= 1, float > 0)
        multiple_of: 2              # optional (int): the value written is rounded to a multiple (Optuna keeps its own)
        key: zero_optimization.reduce_bucket_size
        default: 500_000_000
        when: stage >= 1            # optional condition(s) on parameters defined above
        grid: [50_000_000, 500_000_000]  # optional: explicit values for the grid baseline
        help: ZeRO reduce bucket in elements   # optional
      activation_checkpointing:
        kind: categorical
        choices: [false, true]
        train: activation_checkpointing  # instead of `key`: a training setting outside the ds_config
        default: false

* ``key`` or ``train``, exactly one. ``train`` names a :class:`~tuner.workload.TrainSpec` field that a ds_config does
  not carry; only ``activation_checkpointing`` is supported, returned as :attr:`Suggestion.activation_checkpointing`.
* ``default: null`` leaves the key unset, so DeepSpeed decides (``overlap_comm``'s default depends on the stage); for
  a ``train`` parameter or a batch key it means the workload's own value.
* ``when``: one clause ``NAME OP VALUE`` with ``OP`` one of ``== != >= <= > < in``, ``not in``, several joined with
  ``and`` or given as a YAML list (all must hold). ``VALUE`` is read as YAML: ``3``, ``cpu``, ``true``, ``[1, 2]``.
  ``NAME`` must be a parameter defined above. A parameter whose condition fails (or names an inactive parameter) is
  not suggested and writes nothing, so ``stage3_*`` keys appear only in ZeRO-3 configs: Optuna's way of handling
  conditional spaces.
* ``nvme_choices`` (categorical only): extra choices offered only when an NVMe path is given to
  :meth:`SearchSpace.suggest`; every offload section whose ``device`` is ``nvme`` then gets that ``nvme_path``.
* Batch sizes: a parameter with key ``train_micro_batch_size_per_gpu`` is the micro-batch, one with key
  ``gradient_accumulation_steps`` the accumulation (it must come after the micro-batch). Without a global batch,
  both are searched freely (or taken from the workload when absent). With a fixed global batch, the accumulation is
  derived: ``micro × accumulation × data-parallel world size == global batch``. A categorical micro-batch is then
  offered only the choices that divide ``global batch / world size``; a micro-batch that cannot divide it (an int
  parameter or a pin) raises :class:`InfeasibleConfig`, which the study records as a pruned trial.
  ``train_batch_size`` is always written by the space and may not be a parameter key nor appear in ``base``.
* Precision is not a parameter: the workload's ``TrainSpec.precision`` decides the ``bf16``/``fp16`` section (a
  ``bf16``/``fp16`` section in ``base`` supplies extra settings for that precision and is dropped for the other).
  An ``optimizer`` section in ``base`` without a ``type`` gets the workload's optimizer (``Adam`` or ``AdamW``).
* Large integers: write ``500_000_000`` or ``5.0e+8``; PyYAML reads ``5e8`` as a string.

Every mistake raises :class:`SpaceError`, whose message names the file and the key, e.g.
``default.yaml: parameters.micro_batch.low: must be a positive integer``.

Example:
    >>> import optuna
    >>> from tuner.space import default_space_path, load_space
    >>> from tuner.workload import ClusterSpec, Workload, load_model
    >>> space = load_space(default_space_path(), pins={"stage": 3})
    >>> workload = Workload(load_model("tiny-gpt2"), ClusterSpec(gpus_per_node=8))
    >>> trial = optuna.create_study().ask()
    >>> suggestion = space.suggest(trial, workload, global_batch=64)
    >>> suggestion.ds_config["zero_optimization"]["stage"], suggestion.ds_config["train_batch_size"]
    (3, 64)
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from tuner.errors import InputError
from tuner.estimator.settings import OFFLOAD_OPTIMIZER_KEYS, OFFLOAD_PARAM_KEYS, ZERO_KEYS, ConfigError, resolve
from tuner.workload import TrainSpec, Workload

__all__ = [
    "InfeasibleConfig",
    "Parameter",
    "SearchSpace",
    "SpaceError",
    "Suggestion",
    "config_key",
    "default_space_path",
    "load_space",
    "parse_space",
    "resolve_space",
    "space_dir",
    "space_names",
]

MICRO_KEY = "train_micro_batch_size_per_gpu"
ACCUM_KEY = "gradient_accumulation_steps"
GLOBAL_KEY = "train_batch_size"
BATCH_KEYS = (MICRO_KEY, ACCUM_KEY)
TRAIN_FIELDS = ("activation_checkpointing",)
KINDS = ("categorical", "int", "float")
TOP_FIELDS = ("version", "description", "base", "parameters")
COMMON_FIELDS = ("kind", "key", "train", "default", "when", "grid", "help")
KIND_FIELDS = {
    "categorical": ("choices", "nvme_choices"),
    "int": ("low", "high", "log", "step", "multiple_of"),
    "float": ("low", "high", "log", "step"),
}
ALL_FIELDS = frozenset(COMMON_FIELDS + KIND_FIELDS["categorical"] + KIND_FIELDS["int"])
MAX_GRID = 64  # values a linear int range may expand to for the grid baseline
OPTIMIZER_TYPES = {"adam": "Adam", "adamw": "AdamW"}
OFFLOAD_SECTIONS = {"offload_optimizer": OFFLOAD_OPTIMIZER_KEYS, "offload_param": OFFLOAD_PARAM_KEYS}
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"  # package data (the repository's search_spaces/ links here)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_COMPARE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|>=|<=|>|<)\s*(\S.*)")
_MEMBER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s+(not\s+in|in)\s+(\S.*)")
_NUMBER_STRING = re.compile(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)[eE][-+]?\d+")
_UNSET = object()


class SpaceError(InputError):
    """A malformed search space or pin; the message names the file and the key.

    Attributes:
        file: The space file's name (or ``<space>`` for one built in code).
        key: The dotted key at fault, e.g. ``parameters.micro_batch.low`` (empty when the whole file is at fault).
        field: ``file: key`` (or the file alone), what a face names as the field at fault.
    """

    def __init__(self, file: str, key: str, message: str) -> None:
        super().__init__(f"{file}: {key}" if key else file, message)
        self.file = file
        self.key = key


class InfeasibleConfig(Exception):  # an outcome, not an error: the study turns it into a pruned trial
    """The trial's values cannot form a valid config (e.g. a micro-batch that does not divide the global batch).

    The study records the trial as pruned with :attr:`reason`, e.g. ``raise optuna.TrialPruned(str(error))``.

    Attributes:
        reason: Why, in one line.
        params: The parameter values decided so far.
    """

    def __init__(self, reason: str, params: Mapping[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.params = dict(params or {})


class TrialLike(Protocol):
    """The part of ``optuna.trial.Trial`` a space uses."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int: ...

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...


@dataclass(frozen=True)
class Suggestion:
    """One trial's configuration.

    Attributes:
        ds_config: A complete DeepSpeed config: batch sizes (``train_batch_size`` included), the precision section,
            ``zero_optimization``, the base sections (optimizer, ...).
        activation_checkpointing: Whether the model recomputes activations (a training setting, not a ds_config
            key): pass it on with :meth:`apply_to`.
        params: What Optuna suggested, by parameter name (equal to ``trial.params``).
        fixed: The values that were not suggested but are in effect: pins, derived accumulation, and defaults of a
            :meth:`SearchSpace.restricted` space.
    """

    ds_config: dict[str, Any]
    activation_checkpointing: bool
    params: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """:func:`config_key` of this suggestion."""
        return config_key(self)

    def train_spec(self, train: TrainSpec) -> TrainSpec:
        """``train`` with this suggestion's micro-batch, accumulation and activation checkpointing."""
        return replace(
            train,
            micro_batch=self.ds_config[MICRO_KEY],
            grad_accum=self.ds_config[ACCUM_KEY],
            activation_checkpointing=self.activation_checkpointing,
        )

    def apply_to(self, workload: Workload) -> Workload:
        """``workload`` with its training settings updated by :meth:`train_spec` (for the estimator and runner)."""
        return replace(workload, train=self.train_spec(workload.train))


def config_key(suggestion: Suggestion | Mapping[str, Any], activation_checkpointing: bool = False) -> str:
    """A stable hash of a config: the ds_config plus activation checkpointing.

    Two trials with equal keys train identically, so the study runs one and reuses its result.

    Args:
        suggestion: A :class:`Suggestion`, or a bare ds_config dict.
        activation_checkpointing: Used with a bare ds_config only.

    Returns:
        16 hex digits.

    Example:
        >>> config_key({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}) == config_key(
        ...     {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
        True
    """
    if isinstance(suggestion, Suggestion):
        config, checkpointing = suggestion.ds_config, suggestion.activation_checkpointing
    else:
        config, checkpointing = dict(suggestion), activation_checkpointing
    payload = {"activation_checkpointing": bool(checkpointing), "ds_config": config}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps booleans apart from numbers (``True != 1`` here)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _member(value: Any, values: Iterable[Any]) -> bool:
    return any(_same(value, other) for other in values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Condition:
    """One ``when`` clause: ``name op value``."""

    name: str
    op: str
    value: Any

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Whether the clause holds for the active values (an inactive or unset ``name`` never satisfies it)."""
        current = values.get(self.name)
        if current is None:
            return False
        if self.op == "==":
            return _same(current, self.value)
        if self.op == "!=":
            return not _same(current, self.value)
        if self.op == "in":
            return _member(current, self.value)
        if self.op == "not in":
            return not _member(current, self.value)
        if not _is_number(current):
            return False
        return {">=": current >= self.value, "<=": current <= self.value, ">": current > self.value}.get(
            self.op, current < self.value
        )

    def __str__(self) -> str:
        return f"{self.name} {self.op} {json.dumps(self.value)}"


@dataclass(frozen=True)
class Parameter:
    """One searchable setting, as read from a space file.

    Attributes:
        name: The Optuna parameter name.
        kind: ``categorical``, ``int`` or ``float``.
        key: The dotted ds_config key it sets (None for a ``train`` parameter).
        train: The ``TrainSpec`` field it sets instead of a ds_config key.
        default: Its value when not searched (None: leave it to DeepSpeed / the workload).
        choices: Categorical choices.
        nvme_choices: Categorical choices offered only with an NVMe path.
        low: Lower bound (int/float).
        high: Upper bound (int/float).
        log: Log scale (int/float).
        step: Step (int/float), None for none.
        when: Conditions that must all hold for the parameter to apply.
        grid_values: Explicit grid values, or None.
        help: A description.
    """

    name: str
    kind: str
    key: str | None
    train: str | None
    default: Any
    choices: tuple[Any, ...] = ()
    nvme_choices: tuple[Any, ...] = ()
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    multiple_of: int = 1
    when: tuple[Condition, ...] = ()
    grid_values: tuple[Any, ...] | None = None
    help: str = ""

    def rounded(self, value: int) -> int:
        """``value`` rounded to the nearest ``multiple_of`` within the bounds (DeepSpeed wants even bucket sizes)."""
        if self.multiple_of == 1:
            return value
        rounded = round(value / self.multiple_of) * self.multiple_of
        if rounded > self.high:
            rounded -= self.multiple_of
        return max(rounded, -(-int(self.low) // self.multiple_of) * self.multiple_of)

    def all_choices(self, nvme: bool = True) -> tuple[Any, ...]:
        """Categorical choices, with the NVMe-only ones when ``nvme``."""
        return self.choices + (self.nvme_choices if nvme else ())

    def contains(self, value: Any, nvme: bool = True) -> bool:
        """Whether ``value`` is one this parameter can take."""
        if self.kind == "categorical":
            return _member(value, self.all_choices(nvme))
        if not _is_number(value) or (self.kind == "int" and not isinstance(value, int)):
            return False
        if not self.low <= value <= self.high:  # type: ignore[operator]
            return False
        if self.step is not None and self.kind == "int":
            return (value - self.low) % self.step == 0  # type: ignore[operator]
        return True

    def active(self, values: Mapping[str, Any]) -> bool:
        """Whether every ``when`` clause holds for the active ``values``."""
        return all(condition.holds(values) for condition in self.when)

    @property
    def when_text(self) -> str:
        """The condition, readable."""
        return " and ".join(str(condition) for condition in self.when)

    def grid(self, nvme: bool = False) -> list[Any]:
        """Values for the grid baseline: explicit ``grid``, categorical choices, or for ints the powers of two within
        the bounds (log scale) or every step (linear, at most 64 values)."""
        if self.grid_values is not None:
            return list(self.grid_values)
        if self.kind == "categorical":
            return list(self.all_choices(nvme))
        low, high = self.low, self.high
        if self.kind == "int" and self.log:
            values, power = [], 1
            while power <= high:  # type: ignore[operator]
                if power >= low:  # type: ignore[operator]
                    values.append(power)
                power *= 2
            return values or [low]
        if self.kind == "int":
            values = list(range(low, high + 1, self.step or 1))  # type: ignore[arg-type, operator]
            if len(values) <= MAX_GRID:
                return values
        raise ValueError(f"give `grid: [...]` for {self.name}: its range has no natural grid")

    def suggest(self, trial: TrialLike, choices: Sequence[Any] | None = None) -> Any:
        """Ask ``trial`` for a value (``choices`` overrides the categorical choices)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices if choices is None else choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)  # type: ignore[arg-type]
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)  # type: ignore[arg-type]


class SearchSpace:
    """A validated search space: parameters in order, a base ds_config, and pins.

    Build one with :func:`load_space`. Spaces are immutable: :meth:`with_pins` and :meth:`restricted` return new
    ones.

    Example:
        >>> space = load_space(default_space_path())
        >>> "stage" in space.names and "offload_param" in space.names
        True
        >>> space.restricted(["stage"]).searched
        ('stage',)
    """

    def __init__(
        self,
        parameters: Sequence[Parameter],
        base: Mapping[str, Any] | None = None,
        source: str = "<space>",
        pins: Mapping[str, Any] | None = None,
        frozen: Iterable[str] = (),
    ) -> None:
        """Assemble a space. Prefer :func:`load_space`, which validates the parameters.

        Args:
            parameters: The parameters, in suggestion order.
            base: The ds_config fragment every trial starts from.
            source: The file name used in error messages.
            pins: Parameter name (or key path) -> value; validated here.
            frozen: Names fixed at their default (see :meth:`restricted`).
        """
        self._parameters = tuple(parameters)
        self._by_name = {parameter.name: parameter for parameter in self._parameters}
        self._by_key = {parameter.key: parameter for parameter in self._parameters if parameter.key}
        self._base = copy.deepcopy(dict(base or {}))
        self.source = source
        self._frozen = frozenset(frozen)
        self._micro = next((p.name for p in self._parameters if p.key == MICRO_KEY), None)
        self._accum = next((p.name for p in self._parameters if p.key == ACCUM_KEY), None)
        self._pins = self._check_pins(pins or {})

    # --- inspection ---------------------------------------------------------------------------------------------

    @property
    def parameters(self) -> tuple[Parameter, ...]:
        """All parameters, in suggestion order."""
        return self._parameters

    @property
    def names(self) -> tuple[str, ...]:
        """All parameter names, in order."""
        return tuple(self._by_name)

    @property
    def searched(self) -> tuple[str, ...]:
        """Names Optuna may suggest (neither pinned nor frozen)."""
        return tuple(name for name in self._by_name if name not in self._pins and name not in self._frozen)

    @property
    def pins(self) -> dict[str, Any]:
        """The pins in effect, by parameter name."""
        return dict(self._pins)

    @property
    def base(self) -> dict[str, Any]:
        """A copy of the base ds_config fragment."""
        return copy.deepcopy(self._base)

    def parameter(self, name: str) -> Parameter:
        """The parameter called ``name``, or the one writing the ds_config key path ``name``.

        Raises:
            KeyError: No such parameter.
        """
        found = self._by_name.get(name) or self._by_key.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def __repr__(self) -> str:
        return f"SearchSpace({self.source!r}, searched={list(self.searched)}, pins={self._pins})"

    # --- derived spaces -----------------------------------------------------------------------------------------

    def with_pins(self, pins: Mapping[str, Any]) -> SearchSpace:
        """A space with ``pins`` added to (and overriding) the current ones.

        Raises:
            SpaceError: A pin names no parameter or holds a value the parameter cannot take.
        """
        return SearchSpace(self._parameters, self._base, self.source, {**self._pins, **pins}, self._frozen)

    def restricted(self, names: Iterable[str]) -> SearchSpace:
        """A space searching only ``names``; every other parameter is fixed at its ``default``.

        Pins stay in force. Used for the grid baseline together with :meth:`grid`.

        Example:
            >>> space = load_space(default_space_path()).restricted(["stage", "micro_batch"])
            >>> space.searched
            ('stage', 'micro_batch')

        Raises:
            SpaceError: A name is not a parameter of this space.
        """
        wanted = self._names(names, "restricted")
        return SearchSpace(
            self._parameters, self._base, self.source, self._pins, [n for n in self._by_name if n not in wanted]
        )

    def grid(
        self,
        names: Iterable[str] | None = None,
        *,
        global_batch: int | None = None,
        world_size: int = 1,
        nvme_path: str | None = None,
    ) -> dict[str, list[Any]]:
        """Value lists for ``optuna.samplers.GridSampler`` over ``names`` (default: every searched parameter).

        Categorical parameters give their choices, ints their ``grid`` list or the powers of two within the bounds
        (log scale), pinned ones their pin. With ``global_batch``, the micro-batch list keeps only values dividing
        ``global_batch / world_size``. Conditional parameters are in the grid even where they do not apply, so some
        grid points repeat a config: compare :func:`config_key` to skip them.

        Example:
            >>> load_space(default_space_path()).grid(["stage", "micro_batch"], global_batch=16, world_size=4)
            {'stage': [0, 1, 2, 3], 'micro_batch': [1, 2, 4]}

        Raises:
            SpaceError: A name is unknown, or a float parameter without a ``grid`` list.
        """
        result: dict[str, list[Any]] = {}
        for name in self._names(self.searched if names is None else names, "grid"):
            parameter = self._by_name[name]
            if name in self._pins:
                result[name] = [self._pins[name]]
                continue
            try:
                values = parameter.grid(nvme=bool(nvme_path))
            except ValueError as error:
                raise SpaceError(self.source, f"parameters.{name}.grid", str(error)) from None
            if name == self._micro and global_batch is not None:
                values = [v for v in values if (global_batch // world_size) % v == 0] or values
            result[name] = values
        return result

    # --- suggestion ---------------------------------------------------------------------------------------------

    def suggest(
        self,
        trial: TrialLike,
        workload: Workload,
        global_batch: int | None = None,
        nvme_path: str | None = None,
    ) -> Suggestion:
        """Suggest one config: ask ``trial`` for every searched parameter that applies, in file order.

        Args:
            trial: An Optuna trial (or anything with its ``suggest_*`` methods).
            workload: Gives the data-parallel world size, precision, optimizer, and values the space does not set.
            global_batch: Fix ``train_batch_size``; the accumulation is then derived (see the module docstring).
                Keep it the same for every trial of a study (the micro-batch choices depend on it).
            nvme_path: Offer ``nvme_choices`` and write this ``nvme_path`` into NVMe offload sections.

        Returns:
            The :class:`Suggestion`; its ``ds_config`` passes :func:`tuner.estimator.resolve` for ``workload``.

        Raises:
            InfeasibleConfig: The values cannot form a valid config (the reason says why); prune the trial.
            ConfigError: ``global_batch`` is not a positive multiple of the world size.
            SpaceError: A pinned NVMe choice without ``nvme_path``.

        Example:
            >>> import optuna
            >>> from tuner.workload import ClusterSpec, Workload, model_from_param_count
            >>> workload = Workload(model_from_param_count(1e9), ClusterSpec(gpus_per_node=4))
            >>> space = load_space(default_space_path(), pins={"micro_batch": 2})
            >>> s = space.suggest(optuna.create_study().ask(), workload, global_batch=32)
            >>> s.ds_config["gradient_accumulation_steps"], s.ds_config["train_batch_size"]
            (4, 32)
        """
        world = workload.cluster.world_size
        if global_batch is not None:
            if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch <= 0:
                raise ConfigError("global_batch", f"must be a positive integer, got {global_batch!r}")
            if global_batch % world:
                raise ConfigError(
                    "global_batch", f"{global_batch} is not divisible by the data-parallel world size {world}"
                )
        nvme = bool(nvme_path)
        values: dict[str, Any] = {}  # active parameters only
        suggested: dict[str, Any] = {}
        fixed: dict[str, Any] = {}
        for parameter in self._parameters:
            name = parameter.name
            if not parameter.active(values):
                pinned = self._pins.get(name, _UNSET)
                if pinned is not _UNSET and not _same(pinned, parameter.default):
                    raise InfeasibleConfig(
                        f"{name} is pinned to {pinned!r} but applies only when {parameter.when_text}", values
                    )
                continue
            if name == self._accum and global_batch is not None:
                value = self._derive_accum(values, workload, global_batch)
                pinned = self._pins.get(name, _UNSET)
                if pinned is not _UNSET and pinned is not None and pinned != value:
                    raise InfeasibleConfig(
                        f"{name} is pinned to {pinned} but the global batch {global_batch} needs {value}", values
                    )
                fixed[name] = value
            elif name in self._pins:
                value = self._pins[name]
                if not nvme and _member(value, parameter.nvme_choices):
                    raise SpaceError(self.source, f"pins.{name}", f"{value!r} needs an NVMe path (nvme_path)")
                fixed[name] = value
            elif name in self._frozen:
                value = parameter.default
                fixed[name] = value
            else:
                choices = None
                if parameter.kind == "categorical":
                    choices = list(parameter.all_choices(nvme))
                    if name == self._micro and global_batch is not None:
                        per_rank = global_batch // world
                        choices = [c for c in choices if per_rank % c == 0]
                        if not choices:
                            raise InfeasibleConfig(
                                f"no micro-batch choice divides global batch {global_batch} / world size {world}",
                                values,
                            )
                suggested[name] = parameter.suggest(trial, choices)  # what Optuna recorded
                value = parameter.rounded(suggested[name]) if parameter.kind == "int" else suggested[name]
            values[name] = value
            if name == self._micro and global_batch is not None:
                self._check_micro(value, workload, global_batch, values)
        return self._build(workload, values, suggested, fixed, global_batch, nvme_path)

    def _derive_accum(self, values: Mapping[str, Any], workload: Workload, global_batch: int) -> int:
        """Accumulation steps for ``global_batch`` at the current micro-batch."""
        world = workload.cluster.world_size
        micro = self._micro_value(values, workload)
        self._check_micro(micro, workload, global_batch, values)
        return global_batch // (micro * world)

    def _micro_value(self, values: Mapping[str, Any], workload: Workload) -> int:
        micro = values.get(self._micro) if self._micro else None
        return workload.train.micro_batch if micro is None else micro

    def _check_micro(self, micro: Any, workload: Workload, global_batch: int, values: Mapping[str, Any]) -> None:
        if micro is None:
            micro = workload.train.micro_batch
        world = workload.cluster.world_size
        if global_batch % (micro * world):
            raise InfeasibleConfig(
                f"micro-batch {micro} × world size {world} = {micro * world} does not divide "
                f"the global batch {global_batch}",
                values,
            )

    def _build(
        self,
        workload: Workload,
        values: dict[str, Any],
        suggested: dict[str, Any],
        fixed: dict[str, Any],
        global_batch: int | None,
        nvme_path: str | None,
    ) -> Suggestion:
        world = workload.cluster.world_size
        train = workload.train
        config = copy.deepcopy(self._base)
        precision_extra = config.pop(train.precision, None) if train.precision in ("bf16", "fp16") else None
        config.pop("bf16", None)
        config.pop("fp16", None)
        if train.precision in ("bf16", "fp16"):
            config[train.precision] = {**(precision_extra or {}), "enabled": True}
        optimizer = config.get("optimizer")
        if isinstance(optimizer, dict) and "type" not in optimizer:
            optimizer["type"] = OPTIMIZER_TYPES[train.optimizer]
        micro = self._micro_value(values, workload)
        if global_batch is not None:
            accum = global_batch // (micro * world)
            if self._accum is None or self._accum not in values:
                self._check_micro(micro, workload, global_batch, values)
        else:
            accum = values.get(self._accum) if self._accum else None
            accum = train.grad_accum if accum is None else accum
        config[MICRO_KEY] = micro
        config[ACCUM_KEY] = accum
        config[GLOBAL_KEY] = micro * accum * world
        checkpointing = train.activation_checkpointing
        for parameter in self._parameters:
            value = values.get(parameter.name)
            if parameter.name not in values or value is None:
                continue
            if parameter.train == "activation_checkpointing":
                checkpointing = bool(value)
            elif parameter.key and parameter.key not in BATCH_KEYS:
                _set_path(config, parameter.key, value)
        zero = config.get("zero_optimization")
        if isinstance(zero, dict) and nvme_path:
            for section in OFFLOAD_SECTIONS:
                if isinstance(zero.get(section), dict) and zero[section].get("device") == "nvme":
                    zero[section]["nvme_path"] = nvme_path
        try:
            resolve(workload, config)
        except ConfigError as error:
            raise InfeasibleConfig(f"invalid config: {error}", values) from None
        return Suggestion(config, checkpointing, suggested, fixed)

    # --- validation helpers -------------------------------------------------------------------------------------

    def _names(self, names: Iterable[str], where: str) -> list[str]:
        if isinstance(names, str):
            names = [names]
        result = []
        for name in names:
            try:
                result.append(self.parameter(name).name)
            except KeyError:
                raise SpaceError(
                    self.source, where, f"unknown parameter {name!r}; parameters: {', '.join(self._by_name)}"
                ) from None
        return result

    def _check_pins(self, pins: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(pins, Mapping):
            raise SpaceError(self.source, "pins", f"must be a mapping of parameter -> value, got {pins!r}")
        checked: dict[str, Any] = {}
        for name, value in pins.items():
            where = f"pins.{name}"
            try:
                parameter = self.parameter(name)
            except KeyError:
                raise SpaceError(
                    self.source,
                    where,
                    f"names no parameter or key path of this space; parameters: {', '.join(self._by_name)}",
                ) from None
            checked[parameter.name] = _check_value(parameter, value, self.source, where)
        return checked


def _check_value(parameter: Parameter, value: Any, source: str, where: str) -> Any:
    """A pin's value, coerced from a string when the parameter is not a string parameter ("3" -> 3)."""
    if value is None and parameter.default is None:
        return None
    if parameter.kind == "int" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is not None and parameter.contains(value):
        return int(value) if parameter.kind == "int" else value
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        if parsed is not None and not isinstance(parsed, str) and parameter.contains(parsed):
            return parsed
        if parameter.kind == "float" and _NUMBER_STRING.fullmatch(value) and parameter.contains(float(value)):
            return float(value)
    raise SpaceError(source, where, f"{value!r} is not a value of {parameter.name} ({_describe(parameter)})")


def _describe(parameter: Parameter) -> str:
    if parameter.kind == "categorical":
        return "choices: " + ", ".join(json.dumps(c) for c in parameter.all_choices())
    text = f"{parameter.kind} in [{parameter.low}, {parameter.high}]"
    return text + (f" step {parameter.step}" if parameter.step else "") + (" log scale" if parameter.log else "")


def _set_path(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


# --- loading ------------------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate mapping keys (PyYAML silently keeps the last)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )  # pragma: no branch
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def space_dir() -> Path:
    """The folder holding the built-in space files (``tuner/space/builtin``, shipped inside the package)."""
    return BUILTIN_DIR


def default_space_path() -> Path:
    """The built-in default space, ``search_spaces/default.yaml``.

    Example:
        >>> default_space_path().name
        'default.yaml'
    """
    return space_dir() / "default.yaml"


def space_names() -> list[str]:
    """Names of the built-in spaces (file stems in :func:`space_dir`), accepted by :func:`load_space`."""
    return sorted(path.stem for path in space_dir().glob("*.yaml"))


def resolve_space(space: str) -> Path:
    """A search space file, or a built-in space by name (``default``).

    Example:
        >>> resolve_space("default").name
        'default.yaml'
    """
    path = Path(space)
    if path.is_file():
        return path
    builtin = space_dir() / f"{space}.yaml"
    return builtin if builtin.is_file() else path


def load_space(path: str | Path, pins: Mapping[str, Any] | None = None) -> SearchSpace:
    """Load and validate a search space file.

    Args:
        path: A YAML file, or the name of a built-in space (``default``).
        pins: Parameter name or ds_config key path -> value; a pinned parameter is not suggested.

    Returns:
        The validated :class:`SearchSpace`.

    Raises:
        SpaceError: The file is missing, unreadable, or malformed, or a pin is invalid; the message names the file
            and the key.

    Example:
        >>> space = load_space(default_space_path(), pins={"zero_optimization.stage": 3})
        >>> space.pins
        {'stage': 3}
    """
    file = Path(path)
    if not file.exists() and file.suffix == "" and _IDENTIFIER.fullmatch(str(path)):
        with contextlib.suppress(FileNotFoundError):
            file = space_dir() / f"{path}.yaml"
    source = file.name
    if not file.is_file():
        raise SpaceError(source, "", f"no such file: {file}")
    try:
        data = yaml.load(file.read_text(), Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}" if mark else ""
        problem = " ".join(str(part) for part in (error.context, error.problem) if part)
        raise SpaceError(source, where, f"malformed YAML: {problem}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise SpaceError(source, "", f"cannot read: {error}") from None
    return parse_space(data, source, pins)


def parse_space(data: Any, source: str = "<space>", pins: Mapping[str, Any] | None = None) -> SearchSpace:
    """Validate an already-parsed space mapping (what :func:`load_space` reads from YAML).

    Raises:
        SpaceError: As :func:`load_space`.
    """
    if not isinstance(data, dict):
        raise SpaceError(source, "", f"must hold a mapping with a `parameters` section, got {type(data).__name__}")
    for name in data:
        if name not in TOP_FIELDS:
            raise SpaceError(source, str(name), f"unknown field; fields: {', '.join(TOP_FIELDS)}")
    version = data.get("version", 1)
    if _is_number(version) is False or version != 1:
        raise SpaceError(source, "version", f"must be 1, got {version!r}")
    if not isinstance(data.get("description", ""), str):
        raise SpaceError(source, "description", "must be a string")
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise SpaceError(source, "base", f"must be a mapping (a ds_config fragment), got {type(base).__name__}")
    _check_base(base, source)
    raw = data.get("parameters")
    if not isinstance(raw, dict):
        got = "nothing" if raw is None else type(raw).__name__
        raise SpaceError(source, "parameters", f"must be a mapping of name -> parameter, got {got}")
    parameters: list[Parameter] = []
    for name, spec in raw.items():
        parameters.append(_parse_parameter(name, spec, parameters, source))
    _check_keys(parameters, base, source)
    return SearchSpace(parameters, base, source, pins)


def _check_base(base: dict[str, Any], source: str) -> None:
    for key in (GLOBAL_KEY, *BATCH_KEYS):
        if key in base:
            raise SpaceError(source, f"base.{key}", "batch sizes are set by the space (parameters or global batch)")
    zero = base.get("zero_optimization")
    if zero is None:
        return
    if not isinstance(zero, dict):
        raise SpaceError(source, "base.zero_optimization", "must be a mapping")
    for name, value in zero.items():
        if name not in ZERO_KEYS:
            raise SpaceError(source, f"base.zero_optimization.{name}", "unknown DeepSpeed ZeRO key")
        if name in OFFLOAD_SECTIONS and isinstance(value, dict):
            for sub in value:
                if sub not in OFFLOAD_SECTIONS[name]:
                    raise SpaceError(source, f"base.zero_optimization.{name}.{sub}", "unknown DeepSpeed offload key")


def _check_keys(parameters: list[Parameter], base: dict[str, Any], source: str) -> None:
    """Key paths: no two parameters write the same key (or one inside another), none goes through a base value."""
    seen: dict[str, str] = {}
    for parameter in parameters:
        if not parameter.key:
            continue
        where = f"parameters.{parameter.name}.key"
        for other_key, other in seen.items():
            if (
                parameter.key == other_key
                or parameter.key.startswith(other_key + ".")
                or other_key.startswith(parameter.key + ".")
            ):
                raise SpaceError(source, where, f"{parameter.key} overlaps {other_key}, set by parameter {other}")
        seen[parameter.key] = parameter.name
        node: Any = base
        parts = parameter.key.split(".")
        for depth, part in enumerate(parts[:-1]):
            node = node.get(part) if isinstance(node, dict) else None
            if node is not None and not isinstance(node, dict):
                inside = ".".join(parts[: depth + 1])
                raise SpaceError(source, where, f"base.{inside} is not a mapping, so {parameter.key} cannot be set")
    micro = next((i for i, p in enumerate(parameters) if p.key == MICRO_KEY), None)
    accum = next((i for i, p in enumerate(parameters) if p.key == ACCUM_KEY), None)
    if micro is not None and accum is not None and accum < micro:
        raise SpaceError(
            source,
            f"parameters.{parameters[accum].name}",
            f"the accumulation must come after the micro-batch ({parameters[micro].name}): it is derived from it",
        )


def _parse_parameter(name: Any, spec: Any, earlier: list[Parameter], source: str) -> Parameter:
    where = f"parameters.{name}"
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise SpaceError(source, where, "a parameter name must be an identifier (letters, digits, underscores)")
    if not isinstance(spec, dict):
        raise SpaceError(source, where, f"must be a mapping (kind, key, default, ...), got {type(spec).__name__}")
    for field_name in spec:
        if field_name not in ALL_FIELDS:
            raise SpaceError(source, f"{where}.{field_name}", f"unknown field; fields: {', '.join(sorted(ALL_FIELDS))}")
    kind = spec.get("kind")
    if kind is None:
        raise SpaceError(source, f"{where}.kind", f"missing; one of {', '.join(KINDS)}")
    if kind not in KINDS:
        raise SpaceError(source, f"{where}.kind", f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    for field_name in spec:
        if field_name not in COMMON_FIELDS and field_name not in KIND_FIELDS[kind]:
            raise SpaceError(source, f"{where}.{field_name}", f"does not apply to kind {kind}")
    key, train = _parse_target(spec, where, source)
    batch = key in BATCH_KEYS
    fields: dict[str, Any] = {}
    if kind == "categorical":
        fields["choices"] = _parse_choices(spec, "choices", where, source, required=True)
        fields["nvme_choices"] = _parse_choices(spec, "nvme_choices", where, source, required=False)
        for choice in fields["nvme_choices"]:
            if _member(choice, fields["choices"]):
                raise SpaceError(source, f"{where}.nvme_choices", f"{choice!r} is already in choices")
        for choice in fields["choices"] + fields["nvme_choices"]:
            if batch and (not isinstance(choice, int) or isinstance(choice, bool) or choice <= 0):
                raise SpaceError(source, f"{where}.choices", f"must be positive integers, got {choice!r}")
            if train == "activation_checkpointing" and not isinstance(choice, bool):
                raise SpaceError(source, f"{where}.choices", f"must be true or false, got {choice!r}")
    else:
        fields.update(_parse_bounds(spec, kind, where, source, positive=batch))
        if train == "activation_checkpointing":
            raise SpaceError(source, f"{where}.kind", "activation_checkpointing is a boolean: use categorical")
    parameter = Parameter(name=name, kind=kind, key=key, train=train, default=None, help=str(spec.get("help", "")))
    parameter = replace(parameter, **fields)
    if "default" not in spec:
        raise SpaceError(source, f"{where}.default", "missing; the value used when the parameter is not searched")
    default = spec["default"]
    if default is not None and not parameter.contains(default, nvme=False):
        raise SpaceError(source, f"{where}.default", f"{default!r} is not a value of {name} ({_describe(parameter)})")
    if parameter.kind == "int" and default is not None:
        default = int(default)
    grid = spec.get("grid")
    grid_values = None
    if grid is not None:
        if not isinstance(grid, list) or not grid:
            raise SpaceError(source, f"{where}.grid", "must be a non-empty list of values")
        grid_values = []
        for value in grid:
            if parameter.kind in ("int", "float") and _is_number(value) and float(value).is_integer():
                value = int(value) if parameter.kind == "int" else value
            if not parameter.contains(value):
                raise SpaceError(
                    source, f"{where}.grid", f"{value!r} is not a value of {name} ({_describe(parameter)})"
                )
            grid_values.append(value)
        grid_values = tuple(grid_values)
    when = _parse_when(spec.get("when"), f"{where}.when", earlier, source)
    return replace(parameter, default=default, grid_values=grid_values, when=when)


def _parse_target(spec: dict[str, Any], where: str, source: str) -> tuple[str | None, str | None]:
    key, train = spec.get("key"), spec.get("train")
    if (key is None) == (train is None):
        raise SpaceError(source, where, "give exactly one of `key` (a ds_config key path) or `train` (a setting)")
    if train is not None:
        if train not in TRAIN_FIELDS:
            raise SpaceError(source, f"{where}.train", f"unknown training setting {train!r}; one of {TRAIN_FIELDS}")
        return None, train
    if not isinstance(key, str):
        raise SpaceError(source, f"{where}.key", f"must be a string (a dotted ds_config key path), got {key!r}")
    if not _KEY_PATH.fullmatch(key):
        raise SpaceError(source, f"{where}.key", f"{key!r} is not a dotted key path like zero_optimization.stage")
    if key == GLOBAL_KEY:
        raise SpaceError(source, f"{where}.key", f"{GLOBAL_KEY} is derived; search the micro-batch and accumulation")
    parts = key.split(".")
    if parts[0] == "zero_optimization" and len(parts) > 1:
        if parts[1] not in ZERO_KEYS:
            raise SpaceError(source, f"{where}.key", f"{parts[1]!r} is not a DeepSpeed ZeRO key")
        if parts[1] in OFFLOAD_SECTIONS and len(parts) > 2 and parts[2] not in OFFLOAD_SECTIONS[parts[1]]:
            raise SpaceError(source, f"{where}.key", f"{parts[2]!r} is not a DeepSpeed {parts[1]} key")
    return key, None


def _parse_choices(spec: dict[str, Any], name: str, where: str, source: str, required: bool) -> tuple[Any, ...]:
    choices = spec.get(name)
    if choices is None:
        if required:
            raise SpaceError(source, f"{where}.{name}", "missing; a categorical parameter needs a list of choices")
        return ()
    if not isinstance(choices, list) or (required and not choices):
        raise SpaceError(source, f"{where}.{name}", "must be a non-empty list")
    for index, choice in enumerate(choices):
        if choice is not None and not isinstance(choice, (bool, int, float, str)):
            raise SpaceError(source, f"{where}.{name}", f"choices must be scalars, got {choice!r}")
        if _member(choice, choices[:index]):
            raise SpaceError(source, f"{where}.{name}", f"{choice!r} appears twice")
    return tuple(choices)


def _parse_number(value: Any, kind: str, where: str, source: str) -> int | float:
    if isinstance(value, str) and _NUMBER_STRING.fullmatch(value.strip()):
        raise SpaceError(
            source, where, f"{value!r} is read by YAML as a string: write 10_000_000 or 1.0e+7 instead of 1e7"
        )
    if not _is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
        raise SpaceError(source, where, f"must be a number, got {value!r}")
    if kind == "int":
        if isinstance(value, float) and not value.is_integer():
            raise SpaceError(source, where, f"must be an integer, got {value!r}")
        return int(value)
    return value


def _parse_bounds(spec: dict[str, Any], kind: str, where: str, source: str, positive: bool) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    for name in ("low", "high"):
        if name not in spec:
            raise SpaceError(source, f"{where}.{name}", f"missing; an {kind} parameter needs low and high")
        bounds[name] = _parse_number(spec[name], kind, f"{where}.{name}", source)
        if positive and bounds[name] <= 0:
            raise SpaceError(source, f"{where}.{name}", "must be a positive integer")
    low, high = bounds["low"], bounds["high"]
    if low > high:
        raise SpaceError(source, f"{where}.low", f"low {low} > high {high}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(source, f"{where}.log", f"must be true or false, got {log!r}")
    if log and low <= 0:
        raise SpaceError(source, f"{where}.low", f"log scale needs low > 0, got {low}")
    step = spec.get("step")
    if step is not None:
        step = _parse_number(step, kind, f"{where}.step", source)
        if step <= 0:
            raise SpaceError(source, f"{where}.step", f"must be > 0, got {step}")
        if log and step != 1:
            raise SpaceError(source, f"{where}.step", "log scale takes no step")
        if kind == "int" and (high - low) % step:
            raise SpaceError(source, f"{where}.step", f"high - low = {high - low} is not a multiple of step {step}")
        if log:
            step = None
    bounds = {"low": low, "high": high, "log": log, "step": step}
    if "multiple_of" in spec:
        multiple = spec["multiple_of"]
        if kind != "int" or isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
            raise SpaceError(source, f"{where}.multiple_of", f"must be a positive integer, got {multiple!r}")
        if high // multiple * multiple < low:
            raise SpaceError(source, f"{where}.multiple_of", f"no multiple of {multiple} between {low} and {high}")
        bounds["multiple_of"] = multiple
    return bounds


def _parse_when(raw: Any, where: str, earlier: list[Parameter], source: str) -> tuple[Condition, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        clauses = re.split(r"\s+and\s+", raw.strip())
    elif isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        clauses = [clause for item in raw for clause in re.split(r"\s+and\s+", item.strip())]
    else:
        raise SpaceError(source, where, f"must be a condition string like 'stage == 3' or a list of them, got {raw!r}")
    known = {parameter.name: parameter for parameter in earlier}
    conditions = []
    for clause in clauses:
        match = _COMPARE.fullmatch(clause) or _MEMBER.fullmatch(clause)
        if not match:
            raise SpaceError(
                source, where, f"cannot read {clause!r}: write NAME OP VALUE, OP one of == != >= <= > < in, not in"
            )
        name, op, text = match.group(1), " ".join(match.group(2).split()), match.group(3)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise SpaceError(source, where, f"cannot read the value {text!r} in {clause!r}") from None
        if name not in known:
            raise SpaceError(
                source, where, f"names unknown parameter {name!r}; a condition may only name parameters defined above"
            )
        target = known[name]
        if op in ("in", "not in"):
            if not isinstance(value, list):
                raise SpaceError(source, where, f"{op!r} needs a list like [1, 2], got {text!r}")
            tested = value
        elif op in ("==", "!="):
            tested = [value]
        else:
            numeric = target.kind != "categorical" or all(_is_number(c) for c in target.all_choices())
            if not _is_number(value) or not numeric:
                raise SpaceError(source, where, f"{op!r} compares numbers; {clause!r} does not")
            tested = []
        for item in tested:
            if not target.contains(item):
                raise SpaceError(source, where, f"{clause!r} tests {item!r}, which is not a value of {name}")
        conditions.append(Condition(name, op, value))
    return tuple(conditions)
