"""The rooms' import rules: imports run only downwards, and no modules import each other in a loop.

Every import counts, at module level, inside functions and under ``TYPE_CHECKING``: a loop or an upward import there
is still a knot in the design, whatever Python's import order lets through.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tuner"

# Rooms from the ground up; a room may import only rooms of lower layers (and itself).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer)
    for layer in (
        {"tuner", "tuner.errors", "tuner.units"},
        {"tuner.env", "tuner.workload"},
        {"tuner.estimator"},
        {"tuner.space", "tuner.profile", "tuner.storage"},
        {"tuner.measure"},
        {"tuner.requests", "tuner.forecast"},
        {"tuner.study"},
        {"tuner.recommend", "tuner.worker", "tuner.dashboard"},
        {"tuner.api"},
        {"tuner.cli"},
    )
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _imports(module: str) -> Iterator[str]:
    """The package's modules that ``module`` imports (``from a import b`` names ``a.b`` when that is a module, else
    ``a``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
            submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES]
            names = [alias.name for alias in node.names if f"{target}.{alias.name}" not in MODULES]
            candidates = submodules + ([target] if names else [])
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        yield from (name for name in candidates if name in MODULES and name != module)


GRAPH = {module: sorted(set(_imports(module))) for module in MODULES}


def _layer(room: str) -> int:
    return next(index for index, layer in enumerate(LAYERS) if room in layer)


def test_every_room_has_a_layer() -> None:
    rooms = {_room(module) for module in MODULES}
    unplaced = sorted(room for room in rooms if not any(room in layer for layer in LAYERS))
    assert not unplaced, f"rooms without a layer in this test: {unplaced}"


def test_imports_only_run_downwards() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _room(module) != _room(target) and _layer(_room(target)) >= _layer(_room(module))
    ]
    assert not upward, "imports that run up or sideways between rooms:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_loop() -> None:
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in GRAPH[module]:
            if state.get(target) == 1:
                loops.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(loop) for loop in loops)


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_modules_and_functions_stay_small() -> None:
    """No module of the package over 400 lines and no function over 60 (migrations aside): what grows is split by
    concept before the next feature lands in it."""
    big, long = [], []
    for module, path in sorted(MODULES.items()):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            big.append(f"{module}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name} (line {node.lineno}): {length} lines")
    assert not big and not long, "split by concept:\n" + "\n".join(big + long)


def test_few_loose_modules_at_the_root() -> None:
    """At most five ``.py`` files directly in ``tuner/``: everything else lives in a room."""
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(loose) <= 5, loose


def test_other_rooms_use_the_study_through_its_package() -> None:
    """The faces and the worker import :mod:`tuner.study` itself, never one of its modules: what several rooms share
    (calibration, the throughput fit, warm starts, reasons) lives in :mod:`tuner.forecast`."""
    reaching = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _room(module) != "tuner.study" and target.startswith("tuner.study.")
    ]
    assert not reaching, "\n".join(reaching)


def test_the_measure_room_is_split_by_the_process_boundary() -> None:
    """What runs inside a rank (:mod:`tuner.measure.rank`) and what runs around it (:mod:`tuner.measure.driver`)
    never import each other: the driver starts a rank by its module path and reads what it wrote; the two share
    only the room's top-level modules (the run protocol, the measurement)."""
    sides = ("tuner.measure.rank", "tuner.measure.driver")

    def side(module: str) -> str | None:
        return next((name for name in sides if module == name or module.startswith(name + ".")), None)

    crossing = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if side(module) and side(target) and side(module) != side(target)
    ]
    assert not crossing, "\n".join(crossing)
