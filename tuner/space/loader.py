"""Loading space files: YAML read strictly (duplicate keys refused), validated into a :class:`SearchSpace`, and the
built-in spaces shipped in ``builtin/``. The file format is described in :mod:`tuner.space`."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from tuner.estimator.settings import ZERO_KEYS
from tuner.space.conditions import (
    COMPARE,
    MEMBER,
    WORKLOAD_FACTS,
    AnyOf,
    Condition,
    is_number,
    is_positive_int,
    member,
)
from tuner.space.errors import SpaceError
from tuner.space.parameters import NUMBER_STRING, Parameter, not_a_value
from tuner.space.space import OFFLOAD_SECTIONS, SearchSpace
from tuner.space.yaml_bounded import load_bounded
from tuner.units import parse_bytes
from tuner.workload import ACCUM_KEY, BATCH_KEYS, GLOBAL_KEY, MICRO_KEY

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
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"  # package data (the repository's search_spaces/ links here)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


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
        data = load_bounded(file.read_text(), _Loader)  # _Loader is a SafeLoader; aliases' expansion bounded
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
    if is_number(version) is False or version != 1:
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
    if name in WORKLOAD_FACTS:
        raise SpaceError(source, where, f"{name} is a workload fact conditions test; name the parameter otherwise")
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
            if member(choice, fields["choices"]):
                raise SpaceError(source, f"{where}.nvme_choices", f"{choice!r} is already in choices")
        for choice in fields["choices"] + fields["nvme_choices"]:
            if batch and not is_positive_int(choice):
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
    default = parameter.integral(spec["default"])  # an int written 5.0e+8 is the int 500000000
    if default is not None and not parameter.contains(default, nvme=False):
        raise not_a_value(parameter, default, source, f"{where}.default")
    grid = spec.get("grid")
    grid_values = None
    if grid is not None:
        if not isinstance(grid, list) or not grid:
            raise SpaceError(source, f"{where}.grid", "must be a non-empty list of values")
        checked = []
        for value in grid:
            value = parameter.integral(value)
            if not parameter.contains(value):
                raise not_a_value(parameter, value, source, f"{where}.grid")
            checked.append(value)
        grid_values = tuple(checked)
    when = parse_when(spec.get("when"), f"{where}.when", earlier, source)
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
        if member(choice, choices[:index]):
            raise SpaceError(source, f"{where}.{name}", f"{choice!r} appears twice")
    return tuple(choices)


def _parse_number(value: Any, kind: str, where: str, source: str) -> int | float:
    if isinstance(value, str) and NUMBER_STRING.fullmatch(value.strip()):
        raise SpaceError(
            source, where, f"{value!r} is read by YAML as a string: write 10_000_000 or 1.0e+7 instead of 1e7"
        )
    if not is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
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
        if kind != "int" or not is_positive_int(multiple):
            raise SpaceError(source, f"{where}.multiple_of", f"must be a positive integer, got {multiple!r}")
        if high // multiple * multiple < low:
            raise SpaceError(source, f"{where}.multiple_of", f"no multiple of {multiple} between {low} and {high}")
        bounds["multiple_of"] = multiple
    return bounds


def parse_when(raw: Any, where: str, earlier: list[Parameter], source: str) -> tuple[Condition | AnyOf, ...]:
    """A parameter's ``when`` (a string or a list of them, clauses joined by ``and``; one item may instead list
    alternatives joined by ``or``) checked against ``earlier`` parameters and the workload facts
    (:data:`~tuner.space.conditions.WORKLOAD_FACTS`).

    Raises:
        SpaceError: A clause that cannot be read, names no earlier parameter nor workload fact, or tests a value it
            cannot take; an item mixing ``and`` with ``or``.
    """
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise SpaceError(source, where, f"must be a condition string like 'stage == 3' or a list of them, got {raw!r}")
    known = {parameter.name: parameter for parameter in earlier}
    conditions: list[Condition | AnyOf] = []
    for item in items:
        clauses = re.split(r"\s+and\s+", item.strip())
        options = re.split(r"\s+or\s+", item.strip())
        if len(clauses) > 1 and len(options) > 1:
            raise SpaceError(source, where, f"{item!r} mixes and with or: list the alternatives as an item of its own")
        if len(options) > 1:
            conditions.append(AnyOf(tuple(_parse_clause(option, where, known, source) for option in options)))
        else:
            conditions.extend(_parse_clause(clause, where, known, source) for clause in clauses)
    return tuple(conditions)


def _parse_clause(clause: str, where: str, known: Mapping[str, Parameter], source: str) -> Condition:
    """One ``NAME OP VALUE`` clause about an earlier parameter or a workload fact."""
    match = COMPARE.fullmatch(clause) or MEMBER.fullmatch(clause)
    if not match:
        raise SpaceError(
            source, where, f"cannot read {clause!r}: write NAME OP VALUE, OP one of == != >= <= > < in, not in"
        )
    name, op, text = match.group(1), " ".join(match.group(2).split()), match.group(3)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise SpaceError(source, where, f"cannot read the value {text!r} in {clause!r}") from None
    if name in WORKLOAD_FACTS:
        return Condition(name, op, _fact_value(name, op, value, clause, where, source))
    if name not in known:
        raise SpaceError(
            source,
            where,
            f"names unknown parameter {name!r}; a condition may only name parameters defined above or workload "
            f"facts ({', '.join(WORKLOAD_FACTS)})",
        )
    target = known[name]
    if op in ("in", "not in"):
        if not isinstance(value, list):
            raise SpaceError(source, where, f"{op!r} needs a list like [1, 2], got {text!r}")
        tested = value
    elif op in ("==", "!="):
        tested = [value]
    else:
        numeric = target.kind != "categorical" or all(is_number(c) for c in target.all_choices())
        if not is_number(value) or not numeric:
            raise SpaceError(source, where, f"{op!r} compares numbers; {clause!r} does not")
        tested = []
    for item in tested:
        if not target.contains(item):
            raise SpaceError(source, where, f"{clause!r} tests {item!r}, which is not a value of {name}")
    return Condition(name, op, value)


def _fact_value(name: str, op: str, value: Any, clause: str, where: str, source: str) -> Any:
    """The number (or list of numbers) a clause compares a workload fact with; ``*_bytes`` facts read sizes."""

    def number(item: Any) -> int | float:
        if name.endswith("_bytes") and isinstance(item, str):
            try:
                return parse_bytes(item)
            except ValueError as error:
                raise SpaceError(source, where, f"{clause!r}: {error}") from None
        if not is_number(item):
            raise SpaceError(source, where, f"{name} is a number; {clause!r} does not compare it with one")
        return item

    if op in ("in", "not in"):
        if not isinstance(value, list):
            raise SpaceError(source, where, f"{op!r} needs a list like [1, 2], got {value!r}")
        return [number(item) for item in value]
    return number(value)
