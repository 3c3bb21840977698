#!/usr/bin/env bash
# Start (or reuse) a throwaway PostgreSQL server for the store tests and print its URL on stdout.
#
# Idempotent: installs Debian's postgresql package when no server binaries are found, initialises a data folder under
# /tmp on first use, starts the server if it is not running, creates the database dstune_test if missing. Everything but
# the URL goes to stderr. Trust authentication on 127.0.0.1 only: never use this server for anything but tests.
#
#   DSTUNE_TEST_POSTGRES_URL=$(bash tests/start_postgres.sh)
#
# Settings: DSTUNE_PG_PORT (default 55432), DSTUNE_PG_DATA (default /tmp/dstune-pg-$PORT); stop it with
#   pg_ctl -D /tmp/dstune-pg-55432 stop   (as the postgres user when started by root)
set -euo pipefail

PORT="${DSTUNE_PG_PORT:-55432}"
DATA="${DSTUNE_PG_DATA:-/tmp/dstune-pg-$PORT}"
DB=dstune_test
URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/$DB"
log() { echo "start_postgres: $*" >&2; }

find_bindir() {
    local dir
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v pg_ctl)")"
        return 0
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

# One invocation at a time (parallel test workers may all call this).
exec 9>"/tmp/dstune-pg-$PORT.lock"
flock 9

BIN="$(find_bindir || true)"
if [ -z "$BIN" ]; then
    if [ "$(id -u)" != 0 ]; then
        log "PostgreSQL is not installed and installing it needs root (apt-get install postgresql)"
        exit 1
    fi
    log "installing PostgreSQL from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    BIN="$(find_bindir)"
fi

# The server refuses to run as root: run it as the postgres user then (the Debian package creates that user).
if [ "$(id -u)" = 0 ]; then
    as_pg() { runuser -u postgres -- "$@"; }
else
    as_pg() { "$@"; }
fi

if [ ! -s "$DATA/PG_VERSION" ]; then
    log "initialising $DATA"
    rm -rf "$DATA"
    mkdir -p "$DATA"
    [ "$(id -u)" = 0 ] && chown postgres: "$DATA"
    chmod 700 "$DATA"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale >&2
    cat >>"$DATA/postgresql.conf" <<CONF
# dstune test server: local only, fast and not durable
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DATA'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
CONF
fi

if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "starting the server on 127.0.0.1:$PORT"
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 start >&2 9>&- || {
        tail -n 20 "$DATA/server.log" >&2 || true
        exit 1
    }
fi

PSQL=("$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -X -q -t -A)
for _ in $(seq 1 60); do
    "${PSQL[@]}" -d postgres -c "SELECT 1" >/dev/null 2>&1 && break
    sleep 0.5
done
if [ "$("${PSQL[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]; then
    "${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB" >&2
fi
echo "$URL"
