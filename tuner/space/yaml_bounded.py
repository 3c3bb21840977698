"""YAML loaded with alias expansion bounded: a document whose aliases would expand past :data:`MAX_NODES` nodes
(the "billion laughs": nine anchors of nine aliases each is 9**9 strings) or past :data:`MAX_BYTES` bytes of scalars
(one long string aliased a few thousand times) is refused before a Python object is built, as a
:class:`yaml.YAMLError` with the document's position, so every caller's YAML error handling reports it.

PyYAML builds one shared object per anchor, so the bomb is small in memory until something walks it (a JSON dump,
a copy, a merge of ``base``): the expanded size is what is bounded, counted over the node graph (each node once,
memoized), in time linear in the document.

Example:
    >>> load_bounded("a: [1, 2]\\nb: {c: x}")
    {'a': [1, 2], 'b': {'c': 'x'}}
    >>> bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\\n" + "".join(
    ...     f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\\n" for p, c in zip("abcdefg", "bcdefgh")
    ... )
    >>> load_bounded(bomb)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.space.yaml_bounded.AliasBomb: the YAML's aliases expand past 100000 nodes ...
    >>> load_bounded("a: &a [x, *a]")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.space.yaml_bounded.AliasBomb: the YAML's aliases expand past 100000 nodes ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

MAX_NODES = 100_000  # nodes of the document with every alias expanded: far beyond any search space
MAX_BYTES = 16 * 2**20  # bytes of scalars with every alias expanded (a search space is a few kilobytes)


class AliasBomb(yaml.MarkedYAMLError):
    """The document's aliases expand past the bound."""


def _one(node: yaml.Node) -> int:
    return 1


def scalar_bytes(node: yaml.Node) -> int:
    """A node's own bytes: a scalar's text (at least 1), nothing for a collection."""
    return max(1, len(node.value)) if isinstance(node, yaml.ScalarNode) else 0


def expanded_size(root: yaml.Node, limit: int = MAX_NODES, weigh: Callable[[yaml.Node], int] = _one) -> int:
    """How many nodes ``root`` holds with every alias expanded (or, with ``weigh``, their summed weight: bytes),
    counted up to just past ``limit``; a recursive document (an alias inside its own anchor) expands without end, so
    it counts as past ``limit``."""
    sizes: dict[int, int] = {}
    entered: set[int] = set()  # nodes whose children are being counted
    pending: list[tuple[yaml.Node, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        if id(node) in sizes:
            continue
        if not children_done:
            if id(node) in entered:  # reached again from inside itself: a cycle
                return limit + 1
            entered.add(id(node))
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [item for pair in node.value for item in pair]
        if children_done or not children:
            sizes[id(node)] = min(limit + 1, weigh(node) + sum(sizes[id(child)] for child in children))
            continue
        pending.append((node, True))
        pending.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def load_bounded(
    text: str, loader: type[Any] = yaml.SafeLoader, max_nodes: int = MAX_NODES, max_bytes: int = MAX_BYTES
) -> Any:
    """``yaml.load(text, Loader=loader)`` (a safe loader), refusing a document that expands past ``max_nodes`` or
    ``max_bytes``."""
    instance = loader(text)
    try:
        node = instance.get_single_node()
        if node is None:
            return None
        if expanded_size(node, max_nodes) > max_nodes:
            raise AliasBomb(
                None, None, f"the YAML's aliases expand past {max_nodes} nodes (an alias bomb?)", node.start_mark
            )
        if expanded_size(node, max_bytes, scalar_bytes) > max_bytes:
            raise AliasBomb(
                None, None, f"the YAML's aliases expand past {max_bytes} bytes (an alias bomb?)", node.start_mark
            )
        return instance.construct_document(node)
    finally:
        instance.dispose()


__all__ = ["MAX_BYTES", "MAX_NODES", "AliasBomb", "expanded_size", "load_bounded", "scalar_bytes"]
