"""Loading space files: YAML read strictly (duplicate keys refused), validated into a :class:`SearchSpace`, and the
built-in spaces shipped in ``builtin/``. The file format is described in :mod:`tuner.space`."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tuner.space.assemble import OFFLOAD_SECTIONS
from tuner.space.conditions import is_number
from tuner.space.errors import SpaceError
from tuner.space.parameter_entry import IDENTIFIER, parse_parameter
from tuner.space.parameters import Parameter
from tuner.space.space import SearchSpace
from tuner.space.yaml_bounded import load_bounded
from tuner.workload import ACCUM_KEY, BATCH_KEYS, GLOBAL_KEY, MICRO_KEY, ZERO_KEYS

TOP_FIELDS = ("version", "description", "base", "parameters")
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"  # package data (the repository's search_spaces/ links here)


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
    if not file.exists() and file.suffix == "" and IDENTIFIER.fullmatch(str(path)):
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
        parameters.append(parse_parameter(name, spec, parameters, source))
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
