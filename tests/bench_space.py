"""The search-efficiency bench's space (ZeRO stage × micro-batch × checkpointing, everything else pinned), read from
the bench's own source so tests and the bench cannot drift apart."""

import ast
from pathlib import Path

import yaml

from tuner.space import SearchSpace, parse_space

BENCH = Path(__file__).resolve().parents[1] / "bench" / "search_efficiency.py"


def bench_space() -> SearchSpace:
    """The space ``SPACE_YAML`` in ``bench/search_efficiency.py`` declares."""
    tree = ast.parse(BENCH.read_text())
    text = next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SPACE_YAML"
    )
    return parse_space(yaml.safe_load(text), "search_efficiency.yaml")
