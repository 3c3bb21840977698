"""What a reader without the API token sees of a stored error (:func:`public_error`): one line, without command
lines or paths. The API's public view (:mod:`tuner.api.readers`) and the dashboard's pages (open to anyone) show
errors through it. Pure.

Example:
    >>> public_error("Traceback (most recent call last):\\n  File /srv/x.py, line 1\\nRuntimeError: bad /srv/data")
    'RuntimeError: bad <path>'
"""

from __future__ import annotations

import re

HIDDEN = "<path>"
# an absolute (or home) path, starting a word, up to a delimiter ("tokens/s" is none)
PATH = re.compile(r"(?<![\w.~/-])(?:~|[A-Za-z]:)?[/\\][^\s'\",;)\]]+")
ARGV = re.compile(r"\[(?:\s*'[^']*'\s*,?)+\]")  # a Python list of strings: an argv
MAX_PUBLIC_ERROR = 300


def public_error(text: str | None) -> str | None:
    """An error's one line without command lines or paths: its first line, or a traceback's last (the exception),
    paths and argv lists replaced, at most :data:`MAX_PUBLIC_ERROR` characters."""
    if not text or not text.strip():
        return text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    line = PATH.sub(HIDDEN, ARGV.sub("[<command>]", line))
    return line[:MAX_PUBLIC_ERROR]


__all__ = ["HIDDEN", "PATH", "public_error"]
