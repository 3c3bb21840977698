"""Every user pattern runs in linear time (RE2): the classic catastrophic-backtracking shapes finish at once on long
names, and what RE2 cannot express is refused naming the field."""

from __future__ import annotations

import time

import pytest

from tuner.errors import InputError
from tuner.workload import TrainableSpec, WorkloadError
from tuner.workload.patterns import MAX_PATTERN, compile_pattern, full_matches, suffix_matches

# exponential or high-polynomial in Python's re on a non-matching text of ~40-60 characters
HOSTILE = ["(.|.)*z", "(a+)+$", "(a|aa)*b", "((a*)*)*b", "(a|a?)+c", "(.*a){25}x", "(\\w+\\s?)+$"]
TEXT = "a" * 60 + "!"


@pytest.mark.parametrize("pattern", HOSTILE)
def test_backtracking_shapes_run_in_linear_time(pattern: str) -> None:
    started = time.perf_counter()
    regex = compile_pattern(pattern, "freeze")
    for _ in range(100):
        regex.search(TEXT)
        full_matches(pattern, [TEXT, "model.layers.0.q_proj"], "peft.target_modules")
        suffix_matches(pattern, [TEXT], "peft.rank_pattern")
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("pattern", HOSTILE)
def test_freeze_spec_accepts_or_refuses_at_once(pattern: str) -> None:
    started = time.perf_counter()
    assert TrainableSpec(freeze=pattern).freeze == pattern
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("pattern", ["(a)\\1", "(?=a)b", "(?<!a)b", "(", "a{2000}"])
def test_what_re2_cannot_run_is_refused_naming_the_field(pattern: str) -> None:
    with pytest.raises(InputError, match=r"^peft.target_modules: not a regular expression RE2 can run"):
        compile_pattern(pattern, "peft.target_modules")
    with pytest.raises(WorkloadError, match=r"^freeze: "):
        TrainableSpec(freeze=pattern)


def test_too_long_or_not_a_string_is_refused() -> None:
    with pytest.raises(InputError, match="at most"):
        compile_pattern("a" * (MAX_PATTERN + 1), "freeze")
    with pytest.raises(InputError, match="must be a string"):
        compile_pattern(3, "freeze")  # type: ignore[arg-type]
