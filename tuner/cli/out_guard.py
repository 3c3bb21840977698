"""An ``--out`` file is never a database nor anything but a config: a file that starts as an SQLite database (the
study's own, named by mistake) and any existing file that is not JSON (a script, a note, another database's file) are
not overwritten (:func:`refuse_database_out`, exit 2 naming ``out``). An existing
JSON file (an earlier export) and an empty one are written over, as an export is meant to be.

Example:
    >>> refuse_database_out("/nonexistent/ds_config.json")
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.cli.common import fail

SQLITE_HEADER = b"SQLite format 3\x00"
READ_AT_MOST = 64 * 2**20  # an exported config is a few kilobytes: a larger file is no earlier export


def _not_json(path: Path) -> str | None:
    """Why the existing file at ``path`` is not one an export may write over, or None (absent, empty or JSON)."""
    if not path.is_file():  # absent, a folder, a device (/dev/full): the write itself says what is wrong
        return None
    try:
        if path.stat().st_size > READ_AT_MOST:
            return "is not a config (larger than any export)"
        data = path.read_bytes()
    except OSError:  # unreadable: the write itself says what is wrong
        return None
    if data.startswith(SQLITE_HEADER):
        return "is an SQLite database (a study's?)"
    if not data.strip():
        return None
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return "exists and is not JSON"
    return None


def refuse_database_out(out: str) -> None:
    """Exit 2 naming ``out`` when ``out`` is an existing file that is not JSON (an SQLite database among them)."""
    why = _not_json(Path(out))
    if why is not None:
        fail("out", f"{out} {why}: not overwritten with a config; name another file")


__all__ = ["refuse_database_out"]
