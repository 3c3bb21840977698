"""The examples in the space room's docstrings run (every module of :mod:`tuner.space`), so they stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tuner.space

pytest.importorskip("optuna")  # the package example asks an Optuna trial

MODULES = ["tuner.space"] + [f"tuner.space.{info.name}" for info in pkgutil.iter_modules(tuner.space.__path__)]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
