#!/usr/bin/env bash
# `make bench-peer`: the turn-overhead scenario against the brain, LangGraph's dev server
# and Aegra side by side, in one run, one table with the ratios (docs/PERFORMANCE.md).
# Each peer goes into a virtualenv outside the clone (like the cargo target directory, so
# a fresh clone reuses it), keyed by a hash of its requirements file so that a changed pin
# gets a clean install instead of an upgrade on top of the old one.
# PYTHON picks LangGraph's interpreter (3.11 or newer, as langgraph-api needs; default
# python3), AEGRA_PYTHON Aegra's (3.12 or newer; default the first such of python3.12,
# python3.13, python3 and the pyenv versions, oldest first: 3.12 is the one it was tried
# on). Aegra that cannot be installed is reported in the table as not run, with the
# reason; LangGraph that cannot be is fatal.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

at_least() { # interpreter minor: whether it runs and is 3.<minor> or newer
  "$1" -c "import sys; sys.exit(sys.version_info < (3, $2))" 2>/dev/null
}

# venv_for root requirements interpreter: installs into root/<hash> unless already there
# (an older hash's virtualenv is removed), and prints the virtualenv's path. The marker is
# written last: a virtualenv left by an interrupted install is not reused. Every step is
# chained, since `set -e` does not apply where a caller tests the function's status.
venv_for() {
  local root=$1 requirements=$2 python=$3
  local venv
  venv=$root/$(sha256sum "$requirements" | cut -c1-16) || return 1
  if [ ! -e "$venv/.installed" ]; then
    echo "bench-peer: installing $requirements into $venv (about a minute)" >&2
    rm -rf "$root" && mkdir -p "$root" &&
      "$python" -m venv "$venv" >&2 &&
      "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2 &&
      touch "$venv/.installed" || return 1
  fi
  echo "$venv"
}

python=${PYTHON:-python3}
if ! at_least "$python" 11; then
  echo "bench-peer: LangGraph's dev server needs Python 3.11 or newer; set PYTHON" >&2
  exit 1
fi
langgraph_venv=$(venv_for /var/tmp/agent-runtime-peer-venv bench/peer/requirements.txt "$python")

aegra_python=${AEGRA_PYTHON:-}
if [ -z "$aegra_python" ]; then
  for candidate in python3.12 python3.13 python3 \
    $(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V); do
    if at_least "$candidate" 12; then aegra_python=$candidate; break; fi
  done
fi
aegra_env=()
if [ -z "$aegra_python" ] || ! at_least "$aegra_python" 12; then
  aegra_env=(BENCH_PEER_AEGRA_SKIPPED="no Python 3.12 or newer found (aegra-api needs it; set AEGRA_PYTHON)")
elif aegra_venv=$(venv_for /var/tmp/agent-runtime-aegra-venv bench/peer/aegra-requirements.txt "$aegra_python"); then
  aegra_env=(BENCH_PEER_AEGRA="$aegra_venv/bin/python")
else
  aegra_env=(BENCH_PEER_AEGRA_SKIPPED="pip install -r bench/peer/aegra-requirements.txt failed (see above)")
fi

cargo build --release --locked --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

env BENCH_ONLY=peer \
  BENCH_PEER_LANGGRAPH="$langgraph_venv/bin/langgraph" \
  BENCH_PEER_DIR="$repo/bench/peer" \
  "${aegra_env[@]}" \
  "$target/release/bench"
