#!/usr/bin/env bash
# Installs what the tests drive besides Rust: the AI SDK client (npm) that parses the
# brain's UI message stream. Idempotent and offline-friendly once installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v npm >/dev/null; then
  echo "test-deps: installing Node.js and npm from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

if [ ! -f tests/ai-sdk/node_modules/.package-lock.json ] \
   || [ tests/ai-sdk/package-lock.json -nt tests/ai-sdk/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/ai-sdk"
  (cd tests/ai-sdk && npm ci --no-audit --no-fund --loglevel=error)
fi
