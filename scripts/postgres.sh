#!/usr/bin/env bash
# Start a private PostgreSQL server for one test run and print its SQLAlchemy URL:
#
#     URL="$(bash scripts/postgres.sh)"          # start; the URL alone on stdout
#     bash scripts/postgres.sh --stop DIR         # stop the server of DIR and delete DIR
#
# Every start makes a cluster of its own, shared with nothing: a data directory in a fresh
# `mktemp -d` directory DIR, a free loopback port, its Unix socket in DIR (not /var/run/postgresql),
# and a superuser role `autopar` whose password is random and lives only in the URL. So two test runs
# on one host (two `bash scripts/test.sh` at once) never see each other's server, role or databases,
# and stopping one leaves the other running. No system cluster is created, started or changed.
# Installs the Debian package only when the server binaries are missing (root, apt-get). As root the
# server runs as the `postgres` user (initdb refuses to run as root). Durability is traded for speed
# (fsync off): the data is thrown away with DIR. When AUTOPAR_PG_STARTED_FILE names a file, DIR is
# written there, so the caller can stop what it started (scripts/test.sh does, on exit).
# Progress goes to stderr, the URL alone to stdout; the exit status is non-zero on any failure.
set -euo pipefail
# Keep stdout for the URL alone: the URL goes to the saved stdout, fd 3. The server must not inherit
# fd 3 (`3>&-`): it would hold the caller's $(...) pipe open for as long as it runs.
exec 3>&1 1>&2
log() { echo "postgres.sh: $*" >&2; }

ROLE=autopar
as_owner=()  # the command prefix that runs the server's tools as the cluster's owner
if [[ "$(id -u)" == 0 ]]; then
    as_owner=(runuser -u postgres --)
fi

server_bin() {
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -z "$found" || ! -x "$found/initdb" || ! -x "$found/pg_ctl" ]]; then
        return 1
    fi
    echo "$found"
}

if [[ "${1:-}" == "--stop" ]]; then
    DIR="${2:?usage: postgres.sh --stop DIR}"
    [[ -d "$DIR/data" ]] || { log "$DIR holds no cluster"; exit 1; }
    BIN="$(server_bin)" || { log "no PostgreSQL binaries to stop $DIR with"; exit 1; }
    log "stopping the PostgreSQL server of $DIR"
    "${as_owner[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m fast -w -t 60 stop >/dev/null || log "pg_ctl stop failed for $DIR"
    rm -rf "$DIR"
    exit 0
fi

if ! BIN="$(server_bin)"; then
    if [[ "$(id -u)" != 0 ]]; then
        log "PostgreSQL is not installed and we are not root: install the 'postgresql' package"
        exit 1
    fi
    log "installing PostgreSQL (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq postgresql >/dev/null
    BIN="$(server_bin)" || { log "the postgresql package installed no server binaries"; exit 1; }
fi

DIR="$(mktemp -d "${TMPDIR:-/tmp}/autopar-pg.XXXXXX")"
if [[ -n "${AUTOPAR_PG_STARTED_FILE:-}" ]]; then
    echo "$DIR" >"$AUTOPAR_PG_STARTED_FILE"  # from here on the caller's cleanup deletes it
fi
cleanup_on_failure() {
    "${as_owner[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup_on_failure ERR
PASSWORD="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
if [[ "$(id -u)" == 0 ]]; then
    chown postgres: "$DIR"
fi
chmod 700 "$DIR"
( umask 077; echo "$PASSWORD" >"$DIR/pwfile" )
if [[ "$(id -u)" == 0 ]]; then chown postgres: "$DIR/pwfile"; fi
log "creating a private cluster in $DIR ($("$BIN/postgres" --version))"
"${as_owner[@]}" "$BIN/initdb" -D "$DIR/data" -U "$ROLE" --pwfile="$DIR/pwfile" -E UTF8 --locale=C.UTF-8 \
    --auth-local=scram-sha-256 --auth-host=scram-sha-256 --no-instructions >/dev/null
rm -f "$DIR/pwfile"

started=0
for _ in 1 2 3 4 5; do  # a free port can be taken between the probe and the bind: try another
    PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    if "${as_owner[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$DIR -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        start >/dev/null 3>&-; then
        started=1
        break
    fi
    log "the server did not start on port $PORT; trying another"
done
[[ "$started" == 1 ]] || { log "could not start PostgreSQL (see $DIR/server.log)"; tail -n 20 "$DIR/server.log" >&2 || true; exit 1; }

PGPASSWORD="$PASSWORD" "$BIN/psql" -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$ROLE" -d postgres \
    -c "CREATE DATABASE $ROLE OWNER $ROLE" >/dev/null
trap - ERR
log "PostgreSQL of $DIR listens on 127.0.0.1:$PORT"
echo "postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$ROLE" >&3
