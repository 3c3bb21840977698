"""A layout is a plug-in: its degree field is named only by its own modules and the registry.

The degree fields are read from :data:`tuner.workload.layouts.LAYOUTS` (a new layout is checked the moment it has a
registry line). Every module of ``tuner/`` is parsed; a module outside the allowed homes that names a degree field (as
an attribute, a keyword argument, a parameter, a variable, a definition, an import or a string constant) fails the test
with its path and line. Other rooms read a degree through the registry's kinds (``layout.degree(kind)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tuner.workload.layouts import LAYOUTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tuner"
FIELDS = frozenset(kind.field for kind in LAYOUTS)

# Where a degree field may be named: each room's layout modules (the registry is tuner/workload/layouts/__init__.py),
# the one layout class and the one description of the ranks.
ALLOWED_FOLDERS = ("tuner/workload/layouts/", "tuner/estimator/layouts/", "tuner/measure/rank/layouts/")
ALLOWED_MODULES = frozenset({"tuner/workload/layout.py", "tuner/workload/ranks.py"})


def _names(node: ast.AST) -> Iterator[str]:
    """The identifiers and string constants ``node`` itself names."""
    if isinstance(node, ast.Attribute):
        yield node.attr
    elif isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
        yield node.arg
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, ast.alias):
        yield node.name.rpartition(".")[2]
        if node.asname:
            yield node.asname
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.MatchClass):
        yield from node.kwd_attrs


def namings(path: Path) -> list[tuple[int, str]]:
    """``(line, field)`` for every place the module at ``path`` names a degree field."""
    found = {
        (getattr(node, "lineno", 0), name)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        for name in _names(node)
        if name in FIELDS
    }
    return sorted(found)


def _allowed(module: str) -> bool:
    return module in ALLOWED_MODULES or module.startswith(ALLOWED_FOLDERS)


def _offenders() -> dict[str, list[tuple[int, str]]]:
    modules = {path.relative_to(ROOT).as_posix(): path for path in sorted(PACKAGE.rglob("*.py"))}
    return {module: found for module, path in modules.items() if not _allowed(module) and (found := namings(path))}


def test_the_fields_come_from_the_registry() -> None:
    assert FIELDS and len(FIELDS) == len(LAYOUTS)


def test_no_module_outside_the_layout_modules_names_a_degree_field() -> None:
    lines = [f"{module}:{line}: names {field}" for module, found in _offenders().items() for line, field in found]
    assert not lines, "read the degree through the registry's kinds instead:\n" + "\n".join(lines)


def test_the_scan_sees_every_way_of_naming_a_field(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "def f(tensor_parallel: int, layout) -> dict:\n"
        "    x = layout.sequence_parallel\n"
        "    g(expert_parallel=2)\n"
        "    return {'hpz_partition_size': x, 'note': 'tensor_parallel.autotp_size'}\n"
    )
    assert namings(source) == [
        (1, "tensor_parallel"),
        (2, "sequence_parallel"),
        (3, "expert_parallel"),
        (4, "hpz_partition_size"),
    ]
