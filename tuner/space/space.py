"""A validated search space (:class:`SearchSpace`): pins, restricted spaces, grids, and trial values turned into a
complete ds_config."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.estimator import resolve
from tuner.space.assemble import assemble
from tuner.space.choices import layout_choices, micro_choices, study_data_parallel, trial_data_parallel
from tuner.space.conditions import WORKLOAD_FACTS, is_positive_int, member, same
from tuner.space.errors import InfeasibleConfig, SpaceError
from tuner.space.facts import workload_facts
from tuner.space.parameters import Parameter, TrialLike, check_value
from tuner.space.pins import implied_pins
from tuner.space.suggestion import Suggestion
from tuner.workload import (
    ACCUM_KEY,
    DEFAULT_ACCUM,
    DEFAULT_MICRO,
    MICRO_KEY,
    ConfigError,
    TrialConfig,
    Workload,
    accumulation_for,
)

_UNSET = object()


class SearchSpace:
    """A validated search space: parameters in order, a base ds_config, and pins.

    Build one with :func:`load_space`. Spaces are immutable: :meth:`with_pins` and :meth:`restricted` return new
    ones.

    Example:
        >>> from tuner.space import default_space_path, load_space
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

    def with_choices(self, name: str, keep: Callable[[Any], bool]) -> SearchSpace:
        """A space whose categorical parameter ``name`` offers only the choices ``keep`` accepts (in their order).

        Raises:
            SpaceError: No such categorical parameter, or ``keep`` accepts none of its choices.
        """
        parameter = self._lookup(name, "with_choices", "is not a parameter of this space")
        kept = tuple(choice for choice in parameter.choices if keep(choice))
        if parameter.kind != "categorical" or not kept:
            raise SpaceError(self.source, f"parameters.{name}.choices", "no choice is left to offer")
        parameters = [replace(p, choices=kept) if p.name == name else p for p in self._parameters]
        return SearchSpace(parameters, self._base, self.source, self._pins, self._frozen)

    def restricted(self, names: Iterable[str]) -> SearchSpace:
        """A space searching only ``names``; every other parameter is fixed at its ``default``.

        Pins stay in force. Used for the grid baseline together with :meth:`grid`.

        Example:
            >>> from tuner.space import default_space_path, load_space
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
        a data-parallel rank's share of it (``world_size`` over the pinned layout's sp × tp), as the trials offer.
        Conditional parameters are in the grid even where they do not apply, so some
        grid points repeat a config: compare :func:`config_key` to skip them.

        Example:
            >>> from tuner.space import default_space_path, load_space
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
            if name == self._micro and global_batch is not None:  # those its trials offer (tuner.space.choices)
                data_parallel = study_data_parallel(self._parameters, self._pins, world_size)
                values = micro_choices(values, global_batch, data_parallel) or values
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
            workload: Gives the data-parallel world size, precision and optimizer (a micro-batch or accumulation the
                space does not set is 1; activation checkpointing, off).
            global_batch: Fix ``train_batch_size``; the accumulation is then derived (see :mod:`tuner.space`).
                Keep it the same for every trial of a study (the micro-batch choices depend on it).
            nvme_path: Offer ``nvme_choices`` and write this ``nvme_path`` into NVMe offload sections.

        Returns:
            The :class:`Suggestion`; its trial config passes :func:`tuner.estimator.resolve` for ``workload``.

        Raises:
            InfeasibleConfig: The values cannot form a valid config (the reason says why); prune the trial.
            ConfigError: ``global_batch`` is not a positive multiple of the world size.
            SpaceError: A pinned NVMe choice without ``nvme_path``.

        Example:
            >>> import optuna
            >>> from tuner.space import default_space_path, load_space
            >>> from tuner.workload import ClusterSpec, Workload, model_from_param_count
            >>> workload = Workload(model_from_param_count(1e9), ClusterSpec(gpus_per_node=4))
            >>> space = load_space(default_space_path(), pins={"micro_batch": 2})
            >>> s = space.suggest(optuna.create_study().ask(), workload, global_batch=32)
            >>> s.trial.ds_config["gradient_accumulation_steps"], s.trial.ds_config["train_batch_size"]
            (4, 32)
        """
        if global_batch is not None:
            check_global_batch(global_batch, workload.cluster.world_size)
        asking = _Asking(trial, workload, global_batch, bool(nvme_path))
        facts = workload_facts(workload)
        for parameter in self._parameters:
            if not parameter.active({**facts, **asking.values}, self._overridden(parameter)):
                self._check_inactive_pin(parameter, {**facts, **asking.values})
                continue
            asking.values[parameter.name] = self._value(parameter, asking)
            if parameter.name == self._micro and global_batch is not None:
                self._derive_accum(asking.values, workload, global_batch)  # prune now, before asking for more values
        return self._build(workload, asking.values, asking.suggested, asking.fixed, global_batch, nvme_path)

    def _overridden(self, parameter: Parameter) -> frozenset[str]:
        """The names whose ``when`` clauses a pin overrides: the workload facts, for a parameter pinned off its
        default (the space's conditions on the workload say where a search offers it; a pin asks for it)."""
        pinned = self._pins.get(parameter.name, _UNSET)
        return (
            frozenset(WORKLOAD_FACTS) if pinned is not _UNSET and not same(pinned, parameter.default) else frozenset()
        )

    def _check_inactive_pin(self, parameter: Parameter, values: Mapping[str, Any]) -> None:
        """A pin of a parameter that does not apply to this trial's values must be its default."""
        pinned = self._pins.get(parameter.name, _UNSET)
        if pinned is not _UNSET and not same(pinned, parameter.default):
            raise InfeasibleConfig(
                f"{parameter.name} is pinned to {pinned!r}, which applies only when "
                f"{parameter.failing(values, self._overridden(parameter))}",
                values,
            )

    def _value(self, parameter: Parameter, asking: _Asking) -> Any:
        """The value of an active parameter: derived (accumulation for a fixed global batch), pinned, frozen at its
        default, or asked of the trial (recorded in ``asking.suggested``)."""
        name, values, global_batch = parameter.name, asking.values, asking.global_batch
        if name == self._accum and global_batch is not None:
            value = self._derive_accum(values, asking.workload, global_batch)
            pinned = self._pins.get(name, _UNSET)
            if pinned is not _UNSET and pinned is not None and pinned != value:
                raise InfeasibleConfig(
                    f"{name} is pinned to {pinned} but the global batch {global_batch} needs {value}", values
                )
            asking.fixed[name] = value
            return value
        if name in self._pins:
            value = self._pins[name]
            if not asking.nvme and member(value, parameter.nvme_choices):
                raise SpaceError(self.source, f"pins.{name}", f"{value!r} needs an NVMe path (nvme_path)")
            asking.fixed[name] = value
            return value
        if name in self._frozen:
            asking.fixed[name] = parameter.default
            return parameter.default
        asking.suggested[name] = parameter.suggest(asking.trial, self._choices(parameter, asking))
        return parameter.rounded(asking.suggested[name]) if parameter.kind == "int" else asking.suggested[name]

    def _choices(self, parameter: Parameter, asking: _Asking) -> list[Any] | None:
        """A categorical parameter's choices for this trial: the layout degrees the workload can run and, with a fixed
        global batch, the micro-batches dividing every data-parallel rank's share (one set for the whole study, as
        Optuna needs: :mod:`tuner.space.choices`); None for numeric parameters."""
        if parameter.kind != "categorical":
            return None
        choices = layout_choices(parameter, parameter.all_choices(asking.nvme), asking.workload)
        global_batch, world = asking.global_batch, asking.workload.cluster.world_size
        if parameter.name == self._micro and global_batch is not None:
            data_parallel = study_data_parallel(self._parameters, self._pins, world)
            choices = micro_choices(choices, global_batch, data_parallel)
            if not choices:
                raise InfeasibleConfig(
                    f"no micro-batch choice divides global batch {global_batch} / {data_parallel} data-parallel ranks",
                    asking.values,
                )
        return choices

    def _derive_accum(self, values: Mapping[str, Any], workload: Workload, global_batch: int) -> int:
        """Accumulation steps for ``global_batch`` at the current micro-batch (1 when none is set).

        Raises:
            InfeasibleConfig: The micro-batch times the world size does not divide ``global_batch``.
        """
        try:
            return accumulation_for(global_batch, self._micro_value(values), self._data_parallel(values, workload))
        except ConfigError as error:
            raise InfeasibleConfig(error.message, values) from None

    def _data_parallel(self, values: Mapping[str, Any], workload: Workload) -> int:
        """The data-parallel ranks of the values so far: the world over the sequence- and tensor-parallel degrees,
        when the space has them (suggested before the batch)."""
        return trial_data_parallel(self._parameters, values, workload.cluster.world_size)

    def _micro_value(self, values: Mapping[str, Any]) -> int:
        micro = values.get(self._micro) if self._micro else None
        return DEFAULT_MICRO if micro is None else micro

    def _build(
        self,
        workload: Workload,
        values: dict[str, Any],
        suggested: dict[str, Any],
        fixed: dict[str, Any],
        global_batch: int | None,
        nvme_path: str | None,
    ) -> Suggestion:
        micro = self._micro_value(values)
        if global_batch is not None:
            accum = self._derive_accum(values, workload, global_batch)
        else:
            chosen = values.get(self._accum) if self._accum else None
            accum = DEFAULT_ACCUM if chosen is None else int(chosen)
        config, checkpointing = assemble(self._base, self._parameters, values, workload.train, nvme_path)
        world = workload.cluster.world_size
        try:
            trial = TrialConfig(config, checkpointing).with_batch(micro, accum, world)
            resolve(workload, trial)
        except ConfigError as error:
            raise InfeasibleConfig(f"invalid config: {error}", values) from None
        return Suggestion(trial, suggested, fixed)

    # --- validation helpers -------------------------------------------------------------------------------------

    def _names(self, names: Iterable[str], where: str) -> list[str]:
        if isinstance(names, str):
            names = [names]
        return [self._lookup(name, where, f"unknown parameter {name!r}").name for name in names]

    def _check_pins(self, pins: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(pins, Mapping):
            raise SpaceError(self.source, "pins", f"must be a mapping of parameter -> value, got {pins!r}")
        checked: dict[str, Any] = {}
        for name, value in pins.items():
            where = f"pins.{name}"
            parameter = self._lookup(name, where, "names no parameter or key path of this space")
            checked[parameter.name] = check_value(parameter, value, self.source, where)
        return implied_pins(self._by_name, checked, self.source)

    def _lookup(self, name: str, where: str, problem: str) -> Parameter:
        """:meth:`parameter`, failing with a :class:`SpaceError` that lists the parameters."""
        try:
            return self.parameter(name)
        except KeyError:
            raise SpaceError(self.source, where, f"{problem}; parameters: {', '.join(self._by_name)}") from None


@dataclass
class _Asking:
    """One suggestion in progress: what it asks with and what it has so far (active parameters only)."""

    trial: TrialLike
    workload: Workload
    global_batch: int | None
    nvme: bool
    values: dict[str, Any] = field(default_factory=dict)
    suggested: dict[str, Any] = field(default_factory=dict)  # what Optuna recorded
    fixed: dict[str, Any] = field(default_factory=dict)


def check_global_batch(global_batch: int, world: int) -> None:
    """Refuse (``ConfigError`` on ``global_batch``) a global batch that is not a positive multiple of the ranks:
    every config the space proposes splits it over them (checked again before a study or job starts)."""
    if not is_positive_int(global_batch):
        raise ConfigError("global_batch", f"must be a positive integer, got {global_batch!r}")
    if global_batch % world:
        raise ConfigError("global_batch", f"{global_batch} is not divisible by the data-parallel world size {world}")
