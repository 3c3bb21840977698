"""Shared test settings: DeepSpeed on CPU, compiled ops cached in .cache, and one database of each backend."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from no_fsync import skip_sqlite_fsync
from postgres import fresh_database

from tuner.measure.op_builds import use_environment_ninja
from tuner.storage import Store

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
os.environ.setdefault("DSTUNE_PROFILE_CACHE", str(ROOT / ".cache" / "profiles"))
os.environ.setdefault("DSTUNE_FORKSERVER_IDLE_S", "60")
# Measured runs start under the deepspeed launcher's rule by default, which passes the user's OMP_NUM_THREADS through
# and otherwise leaves torch one thread per core in each rank: on a 2-core machine two ranks would oversubscribe it
# (4.5x slower steps, docs/launch_env.md). The suite runs as a user who sets one thread per rank; the tests of the
# launchers' rules pass their own environments.
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the tests' fork servers leave soon after the tests
# An API request waits for a new model's profile (a spawned process importing torch and transformers: 10 s on a quiet
# machine, over a minute on a loaded one) instead of answering 503 "retry in 5 s"; the 503 path has its own tests.
os.environ.setdefault("DSTUNE_PROFILE_WAIT_S", "300")
# Every process the tests start (bench ranks, the HF Trainer's launcher, servers) checks DeepSpeed's compiled ops with
# the ninja the product's runs use: with the system's ninja first on PATH, each op was rebuilt (a minute or more of
# both cores) every time a test of the other kind ran after it.
use_environment_ninja()


skip_sqlite_fsync()  # as the test PostgreSQL server: fsync = off (tests/faults/no_fsync.py)

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each backend: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dstune.db'}"
    else:
        with fresh_database() as pg_url:
            yield pg_url


@pytest.fixture
def url(backend_url: str) -> str:
    """The database URL of each backend (the name the store, job and API tests use)."""
    return backend_url


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    """A migrated :class:`Store` over an empty database of each backend."""
    with Store.open(url) as opened:
        yield opened


SLOW_FIXTURES = {"postgres_url", "driver"}  # a PostgreSQL server, a real browser
SLOW_FILES = {  # a real Ray head; training the built-in models in torch; a PostgreSQL server stopped and started
    "test_ray_jobs.py",  # tests/worker/
    "test_models.py",
    "test_database_restart.py",
    "test_forkserver.py",  # a fork server that imports torch and DeepSpeed
}


# Slow tests that act on what every test of the machine shares, so they run alone (``-m serial``): they kill or stop
# the node's fork server (every run's ranks fork from it), restart the PostgreSQL server, or stop and kill workers,
# tuners and ranks while timing what follows.
SERIAL_FOLDERS = {"faults"}
SERIAL_FILES = {"test_forkserver.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tier (``-m slow``): real DeepSpeed, Ray, PostgreSQL, a browser, torch training. The fast tier
    (``-m "not slow"``) is pure logic, doctests, SQLite, the API in-process and fakes of the measurer.

    A slow test runs beside another one (``-n 2 --dist loadgroup``: a file's tests on one worker, so that its
    module fixtures' runs are made once) unless it is ``serial``: then alone, after the rest."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and "postgresql" in callspec.params.values()
        if (
            item.get_closest_marker("deepspeed")
            or on_postgres
            or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
            or item.path.name in SLOW_FILES
        ):
            item.add_marker(pytest.mark.slow)
            if item.path.parent.name in SERIAL_FOLDERS or item.path.name in SERIAL_FILES:
                item.add_marker(pytest.mark.serial)
        item.add_marker(pytest.mark.xdist_group(str(item.path)))


def _op_links() -> dict[str, int]:
    """How many times each DeepSpeed op in the extensions folder was linked, from its ninja build log."""
    root = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    counts: dict[str, int] = {}
    for log in root.glob("*/.ninja_log"):
        lines = log.read_text().splitlines()[1:]  # after the version line: start, end, mtime, output, command hash
        counts[log.parent.name] = sum(line.split("\t")[3:4] == [f"{log.parent.name}.so"] for line in lines)
    return counts


_LINKS_AT_START: dict[str, int] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _LINKS_AT_START.update(_op_links())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which DeepSpeed ops these tests compiled: after tests/prebuild_ops.py none should be (a minute each)."""
    built = {op: n - _LINKS_AT_START.get(op, 0) for op, n in _op_links().items() if n > _LINKS_AT_START.get(op, 0)}
    if built:
        terminalreporter.write_line(f"DeepSpeed ops compiled during these tests (a minute or more each): {built}")
