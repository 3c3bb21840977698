"""A search-space file's YAML is loaded with alias expansion bounded: an alias bomb inside ``base`` is
refused at once, naming the file and line, before any study row is written; ordinary anchors still load."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.space import SpaceError, load_space
from tuner.space.yaml_bounded import MAX_NODES, expanded_size, load_bounded


def bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["base:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nparameters: {}\n"


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    started = time.perf_counter()
    with pytest.raises(SpaceError, match="alias"):
        load_space(path)
    assert time.perf_counter() - started < 2


def test_anchors_within_the_bound_still_load() -> None:
    text = "a: &a {x: 1, y: [1, 2]}\nb: *a\nc: {<<: *a, y: 3}\n"
    assert load_bounded(text) == {"a": {"x": 1, "y": [1, 2]}, "b": {"x": 1, "y": [1, 2]}, "c": {"x": 1, "y": 3}}


def test_the_expanded_size_is_counted_without_expanding() -> None:
    import yaml

    node = yaml.compose(bomb(levels=12))  # 9**12 leaves expanded
    started = time.perf_counter()
    assert expanded_size(node) > MAX_NODES
    assert time.perf_counter() - started < 1


def test_tune_refuses_the_bomb_before_any_study_row(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    db = tmp_path / "dstune.db"
    args = ["tune", "--model", "tiny-gpt2", "--seq-len", "64", "--device", "cpu", "--trials", "1"]
    args += ["--storage", f"sqlite:///{db}"]
    started = time.perf_counter()
    result = CliRunner().invoke(app, [*args, "--space", str(path)])
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: space: ") and "alias" in result.stderr
    assert time.perf_counter() - started < 60
    if db.exists():
        with sqlite3.connect(db) as connection:
            tables = [t for (t,) in connection.execute("select name from sqlite_master where type='table'")]
            for table in (t for t in tables if t.startswith("dstune_") and t != "dstune_alembic_version"):
                assert connection.execute(f"select count(*) from {table}").fetchone() == (0,), table


def test_a_long_string_aliased_thousands_of_times_is_refused_by_its_bytes(tmp_path) -> None:
    """Under 400 KB of YAML expanding to 3.5 GB: few nodes (under the node bound), each alias the whole long string."""
    long = "x" * 350_000
    text = f"a: &a {long}\nb: [{', '.join(['*a'] * 10_000)}]\n"
    assert len(text) < 400_000  # 3.5 GB expanded
    with pytest.raises(yaml.YAMLError, match=r"expand past \d+ bytes"):
        load_bounded(text)
    assert load_bounded(f"a: &a {long}\nb: [*a, *a]\n")["b"][1] == long  # a few aliases of it: fine
