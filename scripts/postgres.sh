#!/usr/bin/env bash
# Make a local PostgreSQL server available for the API tests and print its SQLAlchemy URL.
# Idempotent: installs the Debian package only when missing (root, apt-get), creates and starts a
# cluster only when none is running, and (re)creates the role `autopar` (CREATEDB) with a fresh
# random password on every call (the server listens on loopback only and holds test databases).
# When it started the server itself and AUTOPAR_PG_STARTED_FILE names a file, it writes the cluster
# ("VERSION main") there, so the caller can stop what it started (scripts/test.sh does, on exit).
# Progress goes to stderr, the URL alone to stdout; the exit status is non-zero on any failure.
set -euo pipefail
# Keep stdout for the URL alone: every tool below (pg_ctlcluster prints "Removed stale pid file."
# on stdout, for one) writes to stderr; the URL goes to the saved stdout, fd 3. The server must
# not inherit fd 3 (`3>&-`): it would hold the caller's $(...) pipe open for as long as it runs.
exec 3>&1 1>&2
log() { echo "postgres.sh: $*" >&2; }

PORT="${AUTOPAR_TEST_POSTGRES_PORT:-5432}"
ROLE=autopar
PASSWORD="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"

if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    if [[ "$(id -u)" != 0 ]]; then
        log "PostgreSQL is not installed and we are not root: install the 'postgresql' package"
        exit 1
    fi
    log "installing PostgreSQL (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq postgresql >/dev/null
fi

VERSION="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
if ! pg_lsclusters -h 2>/dev/null | awk -v v="$VERSION" '$1 == v && $2 == "main"' | grep -q .; then
    log "creating cluster $VERSION/main"
    pg_createcluster "$VERSION" main --port "$PORT" >/dev/null 3>&-
fi
if ! pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" && $4 == "online"' | grep -q .; then
    log "starting cluster $VERSION/main"
    pg_ctlcluster "$VERSION" main start 3>&-
    if [[ -n "${AUTOPAR_PG_STARTED_FILE:-}" ]]; then
        echo "$VERSION main" >"$AUTOPAR_PG_STARTED_FILE"
    fi
fi
PORT="$(pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" {print $3}')"

for _ in $(seq 1 30); do
    if su postgres -c "pg_isready -q -h 127.0.0.1 -p $PORT"; then break; fi
    sleep 1
done
su postgres -c "pg_isready -q -h 127.0.0.1 -p $PORT" || { log "server on port $PORT does not answer"; exit 1; }

su postgres -c "psql -q -v ON_ERROR_STOP=1 -p $PORT -d postgres" >/dev/null <<SQL
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
    CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD';
  ELSE
    ALTER ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD';
  END IF;
END
\$\$;
SELECT 'CREATE DATABASE $ROLE OWNER $ROLE' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$ROLE')\gexec
SQL

echo "postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$ROLE" >&3
