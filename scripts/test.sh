#!/usr/bin/env bash
# Install everything (torch 2.13.0 CPU wheel is on every machine's disk) and run all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e '.[runtime,api,dev]'
python -m pytest -n 2 "$@"
