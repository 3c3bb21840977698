"""The one rule for names a user gives a study (the CLI's ``--study``, the API's paths and jobs, the job queue):
letters, digits and ``._:-``, starting with a letter or digit, at most 128 characters. Anything else (empty, control
characters, emoji, a NUL that PostgreSQL refuses, 300 characters that overflow its column) is refused naming the
field, before any database sees it.

Example:
    >>> check_study_name("llama-7b:lora", "study")
    'llama-7b:lora'
    >>> check_study_name("", "study")
    Traceback (most recent call last):
    tuner.errors.InputError: study: must be 1 to 128 letters, digits or ._:- starting with a letter or digit, got ''
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tuner.errors import InputError
from tuner.workload.plain_data import check_text

if TYPE_CHECKING:
    from tuner.workload import Workload

MAX_NAME = 128
MAX_STORED_NAME = 255  # the study-name columns' width: a lookup by a longer name cannot find anything
NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MAX_NAME - 1}}}$"
_NAME = re.compile(NAME_PATTERN)
RULE = f"must be 1 to {MAX_NAME} letters, digits or ._:- starting with a letter or digit"


def is_study_name(name: str) -> bool:
    """Whether ``name`` follows the rule (whole: a trailing newline is refused too)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_study_name(name: str, field: str) -> str:
    """``name`` when it follows the rule, else an :class:`InputError` naming ``field``."""
    if not is_study_name(name):
        shown = repr(name[:40] + ("..." if len(name) > 40 else "")) if isinstance(name, str) else repr(name)
        raise InputError(field, f"{RULE}, got {shown}")
    return name


def readable_name(name: str, field: str) -> str:
    """A name to look a stored study up by: any stored name (defaults of older versions included), refused only
    when no stored name can be it: longer than the column, or holding a control character (PostgreSQL refuses NUL).
    """
    if len(name) > MAX_STORED_NAME:
        raise InputError(field, f"at most {MAX_STORED_NAME} characters")
    check_text(name, field)
    return name


def default_study_name(workload: Workload) -> str:
    """``<model name>-<fingerprint>`` when no name is given; a model name with control characters (an inline
    config's ``_name_or_path``) has them replaced by ``-``."""
    model = re.sub(r"[\x00-\x1f\x7f]", "-", workload.model.name)[:64]
    return f"{model}-{workload.fingerprint()[:8]}"


__all__ = [
    "MAX_NAME",
    "MAX_STORED_NAME",
    "NAME_PATTERN",
    "RULE",
    "check_study_name",
    "default_study_name",
    "is_study_name",
    "readable_name",
]
