"""One searchable setting (:class:`Parameter`): its values, its grid, how it asks a trial, and pin checks."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from tuner.space.conditions import AnyOf, Condition, is_number, member
from tuner.space.errors import InfeasibleConfig, SpaceError

MAX_GRID = 64  # values a linear int range may expand to for the grid baseline
# A float like 1e7 that YAML 1.1 reads as a string.
NUMBER_STRING = re.compile(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)[eE][-+]?\d+")


class TrialLike(Protocol):
    """The part of ``optuna.trial.Trial`` a space uses."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...


@dataclass(frozen=True)
class Parameter:
    """One searchable setting, as read from a space file.

    Attributes:
        name: The Optuna parameter name.
        kind: ``categorical``, ``int`` or ``float``.
        key: The dotted ds_config key it sets (None for a ``train`` parameter).
        train: The :class:`~tuner.workload.TrialConfig` field it sets instead of a ds_config key.
        default: Its value when not searched (None: leave it to DeepSpeed / the workload).
        choices: Categorical choices.
        nvme_choices: Categorical choices offered only with an NVMe path.
        low: Lower bound (int/float).
        high: Upper bound (int/float).
        log: Log scale (int/float).
        step: Step (int/float), None for none.
        when: Conditions that must all hold for the parameter to apply (about earlier parameters and workload
            facts).
        grid_values: Explicit grid values, or None.
        help: A description.

    Example:
        >>> micro = Parameter("micro", "int", "train_micro_batch_size_per_gpu", None, 1, low=1, high=16, log=True)
        >>> micro.grid(), micro.contains(3), micro.contains(True)
        ([1, 2, 4, 8, 16], True, False)
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
    when: tuple[Condition | AnyOf, ...] = ()
    grid_values: tuple[Any, ...] | None = None
    help: str = ""

    def rounded(self, value: int) -> int:
        """``value`` rounded to the nearest ``multiple_of`` within the bounds (DeepSpeed wants even bucket sizes)."""
        if self.multiple_of == 1:
            return value
        assert self.low is not None and self.high is not None, "an int parameter has bounds"
        rounded = round(value / self.multiple_of) * self.multiple_of
        if rounded > self.high:
            rounded -= self.multiple_of
        return max(rounded, -(-int(self.low) // self.multiple_of) * self.multiple_of)

    def integral(self, value: Any) -> Any:
        """``value`` as an int when this is an int parameter and ``value`` an integral float (YAML's ``5.0e+8``)."""
        if self.kind == "int" and isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    def all_choices(self, nvme: bool = True) -> tuple[Any, ...]:
        """Categorical choices, with the NVMe-only ones when ``nvme``."""
        return self.choices + (self.nvme_choices if nvme else ())

    def contains(self, value: Any, nvme: bool = True) -> bool:
        """Whether ``value`` is one this parameter can take."""
        if self.kind == "categorical":
            return member(value, self.all_choices(nvme))
        if not is_number(value) or (self.kind == "int" and not isinstance(value, int)):
            return False
        assert self.low is not None and self.high is not None, "a numeric parameter has bounds"
        if not self.low <= value <= self.high:
            return False
        if self.step is not None and self.kind == "int":
            return (value - self.low) % self.step == 0
        return True

    def searchable_default(self) -> Any:
        """The default as a value Optuna can record for this parameter: the default itself when it is one of the
        parameter's values, else (a ``null`` default, "DeepSpeed decides") the first choice or the lower bound.

        A config proposed outside the sampler (warm start, a retry) is enqueued as values of the parameters'
        distributions; ``None`` is none (Optuna refuses it), so such configs set this value explicitly.

        Example:
            >>> Parameter("overlap", "categorical", "zero_optimization.overlap_comm", None, None,
            ...           choices=(False, True)).searchable_default()
            False
        """
        if self.default is not None and self.contains(self.default):
            return self.default
        if self.kind == "categorical":
            return self.choices[0]
        return self.rounded(int(self.low)) if self.kind == "int" else self.low  # type: ignore[arg-type]

    def active(self, values: Mapping[str, Any], overridden: Collection[str] = ()) -> bool:
        """Whether every ``when`` clause holds for the active ``values`` (and the workload facts among them); a clause
        naming only ``overridden`` names counts as holding (a pin overrides the space's conditions on the workload).

        Example:
            >>> tp = Parameter("tp", "categorical", "t", None, 1, choices=(1, 2), when=(Condition("seq_len", ">", 9),))
            >>> tp.active({"seq_len": 4}), tp.active({"seq_len": 4}, overridden={"seq_len"})
            (False, True)
        """
        return all(condition.names <= set(overridden) or condition.holds(values) for condition in self.when)

    def failing(self, values: Mapping[str, Any], overridden: Collection[str] = ()) -> str:
        """The ``when`` clauses that fail for ``values`` (those naming only ``overridden`` names aside), each with the
        values it tested: ``stage >= 1 (stage = 0)``."""
        failed = [c for c in self.when if not c.names <= set(overridden) and not c.holds(values)]
        tested = (", ".join(f"{name} = {json.dumps(values.get(name))}" for name in sorted(c.names)) for c in failed)
        return " and ".join(f"{condition} ({seen})" for condition, seen in zip(failed, tested, strict=True))

    @property
    def when_text(self) -> str:
        """The condition, readable."""
        several = len(self.when) > 1
        return " and ".join(
            f"({condition})" if several and isinstance(condition, AnyOf) else str(condition) for condition in self.when
        )

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
        """Ask ``trial`` for a value (``choices`` overrides the categorical choices).

        Raises:
            InfeasibleConfig: A config queued in the trial (a retry, a warm start) holds a value not among them.
        """
        if self.kind == "categorical":
            offered = list(self.choices if choices is None else choices)
            try:
                return trial.suggest_categorical(self.name, offered)
            except ValueError as error:  # Optuna: "'8' not in (1, 2, 4)."
                raise InfeasibleConfig(f"{self.name}: the queued value is not offered here ({error})") from None
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)  # type: ignore[arg-type]
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)  # type: ignore[arg-type]


def check_value(parameter: Parameter, value: Any, source: str, where: str) -> Any:
    """A pin's value, coerced from a string when the parameter is not a string parameter ("3" -> 3)."""
    if value is None and parameter.default is None:
        return None
    value = parameter.integral(value)
    if value is not None and parameter.contains(value):
        return int(value) if parameter.kind == "int" else value
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        if parsed is not None and not isinstance(parsed, str) and parameter.contains(parsed):
            return parsed
        if parameter.kind == "float" and NUMBER_STRING.fullmatch(value) and parameter.contains(float(value)):
            return float(value)
    raise not_a_value(parameter, value, source, where)


def not_a_value(parameter: Parameter, value: Any, source: str, where: str) -> SpaceError:
    """The error for a ``value`` that ``parameter`` cannot take, naming the values it can."""
    return SpaceError(source, where, f"{value!r} is not a value of {parameter.name} ({_describe(parameter)})")


def _describe(parameter: Parameter) -> str:
    """The values ``parameter`` takes, for error messages (``choices: 0, 1`` or ``int in [1, 8] log scale``)."""
    if parameter.kind == "categorical":
        return "choices: " + ", ".join(json.dumps(c) for c in parameter.all_choices())
    text = f"{parameter.kind} in [{parameter.low}, {parameter.high}]"
    return text + (f" step {parameter.step}" if parameter.step else "") + (" log scale" if parameter.log else "")
