"""PostgreSQL for the tests: a throwaway server (``tests/start_postgres.sh``) and a fresh database per test.

The server URL comes from ``DSTUNE_TEST_POSTGRES_URL`` (``tests/run.sh`` sets it); without it the start script runs
once per test session. When no server can be had, tests needing one skip with the reason, except under ``CI=true``
where they fail: CI must never pass without the PostgreSQL backend having run.

Use the ``postgres_url`` fixture (``from postgres import postgres_url``) or :func:`fresh_database` in your own fixture.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

URL_ENV = "DSTUNE_TEST_POSTGRES_URL"
START_SCRIPT = Path(__file__).with_name("start_postgres.sh")


def in_ci() -> bool:
    """True when ``CI`` is set to a true value (GitHub Actions, GitLab and most others set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def _server() -> tuple[str | None, str]:
    """(URL, "") or (None, why not): the environment's URL, else whatever the start script prints."""
    url = os.environ.get(URL_ENV)
    if url:
        return url, ""
    try:
        done = subprocess.run(["bash", str(START_SCRIPT)], capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"{START_SCRIPT.name} did not run: {error}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        return None, f"{START_SCRIPT.name} exited {done.returncode}: {tail}"
    return lines[-1].strip(), ""


def server_url() -> str:
    """The test server's URL; skips the calling test when there is none (fails it under CI=true)."""
    url, why = _server()
    if url is None:
        message = f"PostgreSQL server unavailable ({why}); set {URL_ENV} or run tests/start_postgres.sh"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return url


@contextlib.contextmanager
def fresh_database(prefix: str = "dstune_t") -> Iterator[str]:
    """Create a uniquely named empty database on the test server, yield its URL, drop it afterwards."""
    base = sa.make_url(server_url())
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:  # FORCE: connections a test left open do not block the drop
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test."""
    with fresh_database() as url:
        yield url
