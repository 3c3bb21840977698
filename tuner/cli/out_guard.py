"""An ``--out`` file is never a database: a file that starts as an SQLite database does (the study's own, named by
mistake) is not overwritten (:func:`refuse_database_out`, exit 2 naming ``out``).

Example:
    >>> refuse_database_out("/nonexistent/ds_config.json")
"""

from __future__ import annotations

from pathlib import Path

from tuner.cli.common import fail

SQLITE_HEADER = b"SQLite format 3\x00"


def refuse_database_out(out: str) -> None:
    """Exit 2 naming ``out`` when ``out`` is an existing SQLite database file."""
    path = Path(out)
    try:
        with path.open("rb") as existing:
            header = existing.read(len(SQLITE_HEADER))
    except OSError:  # absent, a folder, unreadable: the write itself says what is wrong
        return
    if header == SQLITE_HEADER:
        fail("out", f"{out} is an SQLite database (a study's?): not overwritten with a config; name another file")


__all__ = ["refuse_database_out"]
