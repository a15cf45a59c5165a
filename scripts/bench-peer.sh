#!/usr/bin/env bash
# `make bench-peer`: the turn-overhead scenario against the brain and LangGraph's dev
# server side by side, in one run, one table with the ratio (docs/PERFORMANCE.md).
# LangGraph goes into a virtualenv outside the clone (like the cargo target directory, so
# a fresh clone reuses it), keyed by a hash of bench/peer/requirements.txt so that a
# changed pin gets a clean install instead of an upgrade on top of the old one.
# PYTHON picks the interpreter (3.11 or newer, as langgraph-api needs; default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
requirements=bench/peer/requirements.txt

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "bench-peer: LangGraph's dev server needs Python 3.11 or newer; set PYTHON" >&2
  exit 1
fi

key=$(sha256sum "$requirements" | cut -c1-16)
venv_root=/var/tmp/agent-runtime-peer-venv
venv=$venv_root/$key
# The marker is written last: a virtualenv left by an interrupted install is not reused.
if [ ! -e "$venv/.installed" ]; then
  echo "bench-peer: installing LangGraph into $venv (about a minute)"
  rm -rf "$venv_root"
  mkdir -p "$venv_root"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  touch "$venv/.installed"
fi

cargo build --release --locked --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

BENCH_ONLY=peer \
  BENCH_PEER_LANGGRAPH="$venv/bin/langgraph" \
  BENCH_PEER_DIR="$repo/bench/peer" \
  "$target/release/bench"
