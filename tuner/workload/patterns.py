"""User-supplied regular expressions, compiled with RE2: matching takes time linear in the text, whatever the pattern.

Python's ``re`` backtracks: a pattern such as ``(.|.)*z`` takes exponential time on a 40-character name, and one
request or one ``--freeze`` flag would hang its process. Every pattern a user gives (``freeze``, peft's
``target_modules`` as a string, ``exclude_modules``, ``rank_pattern``/``alpha_pattern`` keys) is compiled here
instead; what RE2 cannot express (back-references, look-around) is refused as a :class:`~tuner.errors.InputError`
naming the field, one line.

Example:
    >>> compile_pattern("embed|lm_head", "freeze").search("model.embed_tokens.weight") is not None
    True
    >>> compile_pattern("(a)\\\\1", "freeze")
    Traceback (most recent call last):
    tuner.errors.InputError: freeze: not a regular expression RE2 can run (linear time): invalid escape sequence: \\1
    >>> full_matches("(.|.)*z", ["a" * 40, "q_proj.z"], "peft.target_modules")
    ['q_proj.z']
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import re2

from tuner.errors import InputError

MAX_PATTERN = 1024  # characters of one user pattern
MAX_PROGRAM_BYTES = 8 << 20  # RE2's memory budget per compiled pattern (its DFA falls back to linear NFA past it)


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the refusal is ours, one line; RE2 would also log to stderr
    options.max_mem = MAX_PROGRAM_BYTES
    return options


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Any:
    return re2.compile(pattern, _options())


def compile_pattern(pattern: str, field: str) -> Any:
    """``pattern`` compiled by RE2 (``search``/``fullmatch`` as :mod:`re`'s), or an :class:`InputError` naming
    ``field`` for a pattern too long or one RE2 cannot express."""
    if not isinstance(pattern, str):
        raise InputError(field, "must be a string (a regular expression)")
    if len(pattern) > MAX_PATTERN:
        raise InputError(field, f"at most {MAX_PATTERN} characters")
    try:
        return _compiled(pattern)
    except re2.error as error:
        detail = error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else str(error)
        raise InputError(field, f"not a regular expression RE2 can run (linear time): {detail}") from None


def full_matches(pattern: str, names: Iterable[str], field: str) -> list[str]:
    """The names ``pattern`` matches whole (peft's rule for a string ``target_modules``), in order."""
    regex = compile_pattern(pattern, field)
    return [name for name in names if regex.fullmatch(name) is not None]


def suffix_matches(pattern: str, names: Iterable[str], field: str) -> list[str]:
    """The names that end with a dotted component sequence ``pattern`` matches (peft's rule for ``rank_pattern``
    and ``alpha_pattern`` keys: ``(.*\\.)?(pattern)$``), in order."""
    regex = compile_pattern(f"(?:.*\\.)?(?:{pattern})", field)
    compile_pattern(pattern, field)  # the key alone must be a pattern too (not one that closes the group above)
    return [name for name in names if regex.fullmatch(name) is not None]


__all__ = ["MAX_PATTERN", "compile_pattern", "full_matches", "suffix_matches"]
