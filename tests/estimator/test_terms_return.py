"""Every term of the estimator returns its contribution: no function in ``tuner/estimator`` writes into what it was
passed (a shared ``phases`` or ``details`` dict, a pinned-bytes tally), so a term's effect is found in what it returns,
and one place combines them (:class:`tuner.estimator.terms.Ledger`, whose methods change only the ledger itself).

Read from the source's syntax tree: a write is an assignment, augmented assignment or ``del`` whose target is an
item or attribute reached from a parameter, or a call of a mutating method on something reached from a parameter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tuner.estimator

ROOT = Path(tuner.estimator.__file__).parent
MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "record"})
TALLIES = frozenset({"HostPins", "Ledger"})  # objects that add up what they are given: never a parameter
# The allocator simulation links and pools its own blocks (a simulation's state, no term of the estimate).
SIMULATION = ROOT / "runtime" / "allocator.py"


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign | ast.Delete):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def writes_to_parameters(source: str, attributes: bool = True) -> list[str]:
    """Each place a function of ``source`` writes into one of its parameters (``self`` and ``cls`` aside), or takes a
    tally (:data:`TALLIES`) as a parameter; ``attributes``: count attribute assignments too."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
        params = {arg.arg for arg in arguments} - {"self", "cls"}
        for arg in arguments:
            if arg.annotation is not None and any(name in ast.unparse(arg.annotation) for name in TALLIES):
                found.append(f"{function.name} takes a tally: {arg.arg}: {ast.unparse(arg.annotation)}")
        for node in ast.walk(function):
            for target in _targets(node):
                kinds = (ast.Subscript, ast.Attribute) if attributes else (ast.Subscript,)
                if isinstance(target, kinds) and _root(target) in params:
                    found.append(f"{function.name}:{node.lineno} writes {ast.unparse(target)}")
            call = node.func if isinstance(node, ast.Call) else None
            if isinstance(call, ast.Attribute) and call.attr in MUTATORS and _root(call.value) in params:
                found.append(f"{function.name}:{node.lineno} calls {ast.unparse(call)}")
    return found


def test_no_function_in_the_estimator_writes_into_what_it_was_passed() -> None:
    found = [
        f"{path.relative_to(ROOT.parent.parent)}: {place}"
        for path in sorted(ROOT.rglob("*.py"))
        for place in writes_to_parameters(path.read_text(), attributes=path != SIMULATION)
    ]
    assert not found, "terms must return their contribution (tuner.estimator.terms):\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_write() -> None:
    source = """
def a(phases, details):
    details["x"] = 1
    phases["forward"].gpu["buffers"] += 2
def b(details, acts):
    details.update(y=1)
    acts.saved -= 3
def c(pins: HostPins):
    return 0
def d(self, local):
    self.total = 1
    mine = {}
    mine["x"] = local["x"]
    return mine
"""
    assert sorted(writes_to_parameters(source)) == [
        "a:3 writes details['x']",
        "a:4 writes phases['forward'].gpu['buffers']",
        "b:6 calls details.update",
        "b:7 writes acts.saved",
        "c takes a tally: pins: HostPins",
    ]
