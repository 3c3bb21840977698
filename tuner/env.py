"""Every ``DSTUNE_*`` environment variable, read in one place (:class:`DstuneEnv`, pydantic-settings).

Commands, the API, the worker and the storage layer all ask :func:`current` (read afresh on each call: tests and
``dstune serve --workers N`` set variables at run time). A command-line flag wins over its variable; the variable over
the built-in default. A bad value fails with one line naming the variable (:class:`tuner.errors.InputError`, field
``DSTUNE_<NAME>``).

- ``DSTUNE_STORAGE``: the database URL of every command, the API and the worker (``sqlite:///dstune.db``);
- ``DSTUNE_API_TOKEN``: the API's bearer token; ``DSTUNE_INSECURE_NO_AUTH=1``: job endpoints without one;
- ``DSTUNE_MAX_BODY_BYTES`` (1,000,000), ``DSTUNE_RECOMMEND_CACHE_S`` (2), ``DSTUNE_REQUEST_BUDGET_S`` (10): the API;
- ``DSTUNE_DB_RETRY_S`` (60): how long a store retries a database it was using that went out of reach (one it never
  reached is retried for 3 s only);
- ``DSTUNE_DB_IDLE_TX_S`` (30): PostgreSQL ends a session idle inside a transaction this long (a stopped or hung
  process), releasing its locks;
- ``DSTUNE_JOB_LEASE_S`` (60): a worker's lease on its job;
- ``DSTUNE_PROFILE_CACHE`` (``~/.cache/dstune/profiles``), ``DSTUNE_PROFILE_QUEUE`` (32), ``DSTUNE_PROFILE_WAIT_S``
  (20): model profiles;
- ``DSTUNE_FORKSERVER_IDLE_S`` (300): how long an idle fork server lives.

Launchers also pass ``DSTUNE_THREADS_PER_RANK``, ``DSTUNE_BIND_CORES`` and ``DSTUNE_SPAWNED_AT`` to the ranks they
start: a protocol between a launcher and its ranks (:mod:`tuner.measure.rank.runner`,
:mod:`tuner.measure.rank.launch_env`), not settings; a rank's threads are the workload's launch environment's
(``--launcher-env``, ``--launch-var``).

Example:
    >>> import os
    >>> os.environ["DSTUNE_JOB_LEASE_S"] = "90"
    >>> current().job_lease_s
    90.0
    >>> del os.environ["DSTUNE_JOB_LEASE_S"]
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from tuner.errors import InputError

PREFIX = "DSTUNE_"
DEFAULT_DB_FILE = "dstune.db"


class DstuneEnv(BaseSettings):
    """The ``DSTUNE_*`` variables, typed, with their defaults (see the module docstring)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True)

    storage: str | None = None
    api_token: str | None = None
    insecure_no_auth: bool = False
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    recommend_cache_s: float = Field(default=2.0, ge=0)
    request_budget_s: float = Field(default=10.0, gt=0)
    db_retry_s: float = Field(default=60.0, ge=0)
    db_idle_tx_s: float = Field(default=30.0, gt=0)
    job_lease_s: float = Field(default=60.0, ge=1)
    profile_cache: Path = Path.home() / ".cache" / "dstune" / "profiles"
    profile_queue: int = Field(default=32, ge=1)
    profile_wait_s: float = Field(default=20.0, ge=0)
    forkserver_idle_s: float = Field(default=300.0, gt=0)

    @property
    def storage_url(self) -> str:
        """``DSTUNE_STORAGE``, else a SQLite file ``dstune.db`` in the current folder."""
        return self.storage or f"sqlite:///{DEFAULT_DB_FILE}"


def current() -> DstuneEnv:
    """The variables as the environment holds them now.

    Raises:
        InputError: A variable holds a value of the wrong kind; the field is the variable's name.
    """
    try:
        return DstuneEnv()
    except ValidationError as error:
        first = error.errors()[0]
        name = PREFIX + "_".join(str(part) for part in first["loc"]).upper()
        raise InputError(name, first["msg"]) from None


def storage_url(flag: str | None = None) -> str:
    """The database a command uses: its ``--storage`` flag, else ``DSTUNE_STORAGE``, else ``sqlite:///dstune.db``."""
    return flag or current().storage_url


__all__ = ["DEFAULT_DB_FILE", "PREFIX", "DstuneEnv", "current", "storage_url"]
