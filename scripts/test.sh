#!/usr/bin/env bash
# Install everything (torch 2.13.0 CPU wheel is on every machine's disk) and run all tests.
# The API tests run on SQLite and on a real PostgreSQL server: when AUTOPAR_TEST_POSTGRES_URL is not
# set, this script starts a private PostgreSQL server of its own (scripts/postgres.sh: a data
# directory, port, socket and role of this run only; the Debian package is installed when missing,
# which needs root), sets the variable, and stops the server and deletes its directory when it exits,
# however it exits. Two runs at once on one host never share a server. It fails loudly if it cannot
# start one; set AUTOPAR_TEST_POSTGRES=skip to run without PostgreSQL.
# Likewise it installs Debian's chromium + chromium-driver for the headless-browser UI test.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "scripts/test.sh: $*" >&2; }
say "creating .venv and installing autopar with its runtime, api and dev extras"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[runtime,api,dev]'
# The frameworks that check the exports (pyproject.toml, extra exports-check): torch stays 2.13.0,
# DeepSpeed builds no kernels, torchtitan comes without its training-time dependencies.
say "installing the frameworks that check the exports (DeepSpeed, accelerate, Megatron-LM, torchtitan, PEFT, torchtune)"
DS_BUILD_OPS=0 python -m pip install -q -c scripts/torch-constraint.txt -e '.[exports-check]'
python -m pip install -q -c scripts/torch-constraint.txt --no-deps torchtitan==0.2.2
# torchtune's recipes, configs and builders, read as source by tests/planner/consumers/check_torchtune.py
python -m pip install -q -c scripts/torch-constraint.txt --no-deps torchtune==0.6.1
# torchtitan 0.3.0 reads a Python config module instead of 0.2's TOML: it goes into a directory of its
# own (the check runs it with that directory first on PYTHONPATH), reinstalled when its pins change.
TT03=.venv/torchtitan-0.3
if ! cmp -s scripts/torchtitan-0.3.txt "$TT03/autopar-requirements.txt"; then
    say "installing torchtitan 0.3.0 and its config loader's imports into $TT03"
    rm -rf "$TT03"
    python -m pip install -q --no-deps --target "$TT03" -r scripts/torchtitan-0.3.txt
    cp scripts/torchtitan-0.3.txt "$TT03/autopar-requirements.txt"
fi

# The web UI test (tests/api/test_ui.py) drives Debian's Chromium through its chromedriver.
if [[ ! -x "${AUTOPAR_CHROMIUM:-/usr/bin/chromium}" || ! -x "${AUTOPAR_CHROMEDRIVER:-/usr/bin/chromedriver}" ]]; then
    echo "scripts/test.sh: installing chromium and chromium-driver for the web UI test" >&2
    if [[ "$(id -u)" != 0 ]] || ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends chromium chromium-driver fonts-liberation >/dev/null; }; then
        echo "scripts/test.sh: could not install chromium and chromium-driver (needs root and apt);" \
             "install them, or point AUTOPAR_CHROMIUM / AUTOPAR_CHROMEDRIVER at a Chromium and its driver" >&2
        exit 1
    fi
fi

if [[ -z "${AUTOPAR_TEST_POSTGRES_URL:-}" && "${AUTOPAR_TEST_POSTGRES:-}" != "skip" ]]; then
    say "starting PostgreSQL for the API tests"
    AUTOPAR_PG_STARTED_FILE="$(mktemp)"
    export AUTOPAR_PG_STARTED_FILE
    stop_postgres() {
        local dir
        dir="$(cat "$AUTOPAR_PG_STARTED_FILE" 2>/dev/null || true)"
        if [[ -n "$dir" ]]; then
            bash scripts/postgres.sh --stop "$dir" || say "could not stop the PostgreSQL server of $dir"
        fi
        rm -f "$AUTOPAR_PG_STARTED_FILE"
    }
    trap stop_postgres EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM  # the EXIT trap runs on the way out
    AUTOPAR_TEST_POSTGRES_URL="$(bash scripts/postgres.sh)" || {
        echo "scripts/test.sh: could not start PostgreSQL for the API tests (see above);" \
             "set AUTOPAR_TEST_POSTGRES=skip to run without it" >&2
        exit 1
    }
    if [[ "$AUTOPAR_TEST_POSTGRES_URL" != postgresql+psycopg://* || "$AUTOPAR_TEST_POSTGRES_URL" == *$'\n'* ]]; then
        echo "scripts/test.sh: scripts/postgres.sh printed no single URL: '$AUTOPAR_TEST_POSTGRES_URL'" >&2
        exit 1
    fi
    export AUTOPAR_TEST_POSTGRES_URL
fi

say "running the tests (pytest -n 2)"
python -m pytest -n 2 --dist loadfile "$@"
