"""What a reader without the API token sees of a stored error (:func:`public_error`): one line, without command
lines, credentials or paths. The API's public view (:mod:`tuner.api.readers`) and the dashboard's pages (open to
anyone) show errors through it. Pure.

Example:
    >>> public_error("Traceback (most recent call last):\\n  File /srv/x.py, line 1\\nRuntimeError: bad /srv/data")
    'RuntimeError: bad <path>'
    >>> public_error("CalledProcessError: Command 'python t.py --hub_token x' returned non-zero exit status 1.")
    "CalledProcessError: Command '<command>' returned non-zero exit status 1."
    >>> public_error("run.py: --api-key abc --lr 0.1 password=hunter2 ghp_" + "Ab3" * 12)
    'run.py: --api-key <secret> --lr 0.1 password=<secret> <secret>'
"""

from __future__ import annotations

import re

from tuner.workload.launch_vars import token_shaped

HIDDEN = "<path>"
SECRET = "<secret>"
# an absolute (or home) path, starting a word, up to a delimiter ("tokens/s" is none)
PATH = re.compile(r"(?<![\w.~/-])(?:~|[A-Za-z]:)?[/\\][^\s'\",;)\]]+")
ARGV = re.compile(r"\[(?:\s*'[^']*'\s*,?)+\]")  # a Python list of strings: an argv
# subprocess's words for a command given as one string (an argv list is ARGV's)
COMMAND = re.compile(r"""(Command )(['"])(?!\[)(.*)\2(?= returned| timed out| died)""")
CREDENTIAL = r"[\w-]*?(?:token|secret|password|passwd|api[_-]?key|access[_-]?key|auth(?:orization)?|credentials?)"
# a flag naming a credential and its value (--hub_token X, --api-key=X), or an assignment (password=X, TOKEN: X,
# Authorization: Bearer X)
SECRET_FLAG = re.compile(rf"(?i)(--?{CREDENTIAL})(=|\s+)([^\s'\",;)\]]+)")
SECRET_ASSIGN = re.compile(rf"(?i)\b({CREDENTIAL})(\s*[=:]\s*)((?:bearer\s+|basic\s+)?[^\s'\",;)\]]+)")
WORD = re.compile(r"[^\s'\",;()\[\]]+")
MAX_PUBLIC_ERROR = 300


def public_error(text: str | None) -> str | None:
    """An error's one line without command lines, credentials or paths: its first line, or a traceback's last (the
    exception), with argv lists and commands, a credential flag's or assignment's value, token-shaped words
    (:func:`tuner.workload.launch_vars.token_shaped`) and paths replaced; at most :data:`MAX_PUBLIC_ERROR`
    characters."""
    if not text or not text.strip():
        return text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    line = COMMAND.sub(r"\1\2<command>\2", ARGV.sub("[<command>]", line))
    line = SECRET_ASSIGN.sub(rf"\1\2{SECRET}", SECRET_FLAG.sub(rf"\1\2{SECRET}", line))
    line = WORD.sub(lambda word: SECRET if token_shaped(word.group()) else word.group(), line)
    return PATH.sub(HIDDEN, line)[:MAX_PUBLIC_ERROR]


__all__ = ["HIDDEN", "PATH", "SECRET", "public_error"]
