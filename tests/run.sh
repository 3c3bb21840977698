#!/usr/bin/env bash
# The test command (README): builds .venv on a fresh machine, then lint and the whole suite.
# torch comes first and pinned to the CPU build on disk: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[run,test]"
export DS_ACCELERATOR=cpu
# DeepSpeed's compiled ops survive between runs (.ci/run points this at the ops README command 1 compiled)
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
.venv/bin/ruff check tuner tests bench
.venv/bin/ruff format --check tuner tests bench
.venv/bin/mypy  # settings in pyproject.toml: the tuner package
# A real PostgreSQL server for the storage contract tests (installed from Debian's packages when missing).
export DSTUNE_TEST_POSTGRES_URL="${DSTUNE_TEST_POSTGRES_URL:-$(bash tests/start_postgres.sh)}"
# DeepSpeed's CPU ops, built once up front (and cached): tests that kill runs must not kill a build half-way.
.venv/bin/python tests/prebuild_ops.py
# Debian's chromium and chromedriver for the dashboard's browser tests.
bash tests/start_browser.sh
if [ "$#" -gt 0 ]; then
    exec .venv/bin/pytest -q -p no:cacheprovider "$@"
fi
# Two tiers: the fast one (pure logic, doctests, SQLite, the API in-process, the study loop over a fake measurer;
# about 2-3 minutes, one test file per core: pytest-xdist) fails first, then the slow one (real DeepSpeed on CPU
# ranks, Ray, PostgreSQL, the browser). Its files run two at a time too: a slow test keeps the cores busy about half
# of its time (starting processes, importing torch, waiting on a peer), so two side by side finish sooner than one
# after the other. The serial ones kill the node's fork server, restart PostgreSQL or start a Ray cluster of their
# own, which no other slow test may see; the fast tier uses none of the three, so they run beside it (their output
# follows the fast tier's). Each run ends with its ten slowest tests, so that growth shows where it happens.
SERIAL_LOG=$(mktemp /tmp/dstune-serial-tests.XXXXXX)
.venv/bin/pytest -q -p no:cacheprovider --durations=10 -m "slow and serial" > "$SERIAL_LOG" 2>&1 &
SERIAL=$!
trap 'kill "$SERIAL" 2> /dev/null || true' EXIT
.venv/bin/pytest -q -p no:cacheprovider --durations=10 -m "not slow" -n 2 --dist loadgroup
echo "== the serial slow tests (run beside the fast tier)"
STATUS=0
wait "$SERIAL" || STATUS=$?
cat "$SERIAL_LOG"
rm -f "$SERIAL_LOG"
[ "$STATUS" -eq 0 ] || exit "$STATUS"
.venv/bin/pytest -q -p no:cacheprovider --durations=10 -m "slow and not serial" -n 2 --dist loadgroup
