#!/usr/bin/env bash
# Installs what the tests drive besides Rust: the AI SDK client (npm) that parses the
# brain's UI message stream, the AG-UI client (npm, tests/agui), the web chat's build and
# browser-test packages (npm), the real MCP servers the connector tests talk to
# (server-everything from npm, mcp-server-time from
# PyPI in tests/mcp/.venv), the official TypeScript MCP client (npm, tests/mcp-client), the
# official MCP conformance suite (npm, tests/mcp-conformance),
# an OAuth authorization server (npm, tests/oauth), the Standard Webhooks library (PyPI,
# tests/webhooks/.venv), the official A2A clients (PyPI a2a-sdk in tests/a2a/.venv, npm
# @a2a-js/sdk in tests/a2a), the official OpenAI SDKs (PyPI and npm openai in
# tests/openai), and the
# S3-protocol server the artifact tests talk to (s3s-fs, cached outside the clone),
# Debian's PgBouncer for the transaction-pooler tests, Debian's Chromium for the worker's browser tests, Debian's bubblewrap for the local launcher's confinement, Debian's prometheus for promtool, and
# schemathesis for the API contract test (cached outside the clone). Idempotent and
# offline-friendly once installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v npm >/dev/null; then
  echo "test-deps: installing Node.js and npm from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

# Debian's python3 lacks venv until python3-venv is installed.
ensure_venv_module() {
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "test-deps: installing python3-venv from Debian packages"
    if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
    $sudo_ apt-get update -qq
    $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
}

if [ ! -f tests/ai-sdk/node_modules/.package-lock.json ] \
   || [ tests/ai-sdk/package-lock.json -nt tests/ai-sdk/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/ai-sdk"
  (cd tests/ai-sdk && npm ci --no-audit --no-fund --loglevel=error)
fi

# The web chat's build (web/, Vite) and its browser test's driver (tests/web/:
# playwright-core for Debian's chromium, axe-core).
for dir in web tests/web; do
  if [ ! -f "$dir/node_modules/.package-lock.json" ] \
     || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    echo "test-deps: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done

if [ ! -f tests/mcp/node_modules/.package-lock.json ] \
   || [ tests/mcp/package-lock.json -nt tests/mcp/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/mcp"
  (cd tests/mcp && npm ci --no-audit --no-fund --loglevel=error)
fi

# The official AG-UI client (npm @ag-ui/client's HttpAgent) for brain/tests/all/agui.rs.
if [ ! -f tests/agui/node_modules/.package-lock.json ] \
   || [ tests/agui/package-lock.json -nt tests/agui/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/agui"
  (cd tests/agui && npm ci --no-audit --no-fund --loglevel=error)
fi

# The official TypeScript MCP client (npm @modelcontextprotocol/sdk) that talks to the
# brain's own MCP server in brain/tests/all/mcp_server.rs.
if [ ! -f tests/mcp-client/node_modules/.package-lock.json ] \
   || [ tests/mcp-client/package-lock.json -nt tests/mcp-client/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/mcp-client"
  (cd tests/mcp-client && npm ci --no-audit --no-fund --loglevel=error)
fi

# The official MCP conformance suite and the Node 22 it needs (Debian's Node is older), as
# npm packages, for brain/tests/all/mcp_conformance.rs.
if [ ! -f tests/mcp-conformance/node_modules/.package-lock.json ] \
   || [ tests/mcp-conformance/package-lock.json -nt tests/mcp-conformance/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/mcp-conformance"
  (cd tests/mcp-conformance && npm ci --no-audit --no-fund --loglevel=error)
fi

# A real OAuth authorization server (npm) for brain/tests/all/oauth_client.rs, run with the
# Node 22 above.
if [ ! -f tests/oauth/node_modules/.package-lock.json ] \
   || [ tests/oauth/package-lock.json -nt tests/oauth/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/oauth"
  (cd tests/oauth && npm ci --no-audit --no-fund --loglevel=error)
fi

if [ ! -f tests/mcp/.venv/.installed ] \
   || [ tests/mcp/requirements.txt -nt tests/mcp/.venv/.installed ]; then
  ensure_venv_module
  echo "test-deps: Python MCP servers in tests/mcp/.venv"
  python3 -m venv tests/mcp/.venv
  tests/mcp/.venv/bin/pip install -q --disable-pip-version-check -r tests/mcp/requirements.txt
  touch tests/mcp/.venv/.installed
fi

# The official Standard Webhooks library (PyPI) behind the receiver of
# brain/tests/all/webhooks.rs, in tests/webhooks/.venv; pip's downloads cached under
# /var/tmp so a fresh clone installs offline.
if [ ! -f tests/webhooks/.venv/.installed ] \
   || [ tests/webhooks/requirements.txt -nt tests/webhooks/.venv/.installed ]; then
  ensure_venv_module
  echo "test-deps: standardwebhooks in tests/webhooks/.venv"
  python3 -m venv tests/webhooks/.venv
  PIP_CACHE_DIR=/var/tmp/agent-runtime-tools/pip-cache \
    tests/webhooks/.venv/bin/pip install -q --disable-pip-version-check -r tests/webhooks/requirements.txt
  touch tests/webhooks/.venv/.installed
fi

# The official A2A clients for brain/tests/all/a2a.rs: a2a-sdk (PyPI) in tests/a2a/.venv and
# @a2a-js/sdk (npm) in tests/a2a/node_modules; downloads cached under /var/tmp so a fresh
# clone installs them without the registries' round trips.
if [ ! -f tests/a2a/.venv/.installed ] \
   || [ tests/a2a/requirements.txt -nt tests/a2a/.venv/.installed ]; then
  ensure_venv_module
  echo "test-deps: a2a-sdk in tests/a2a/.venv"
  [ -x tests/a2a/.venv/bin/pip ] || python3 -m venv tests/a2a/.venv
  tests/a2a/.venv/bin/pip install -q --disable-pip-version-check \
    --cache-dir /var/tmp/agent-runtime-tools/pip-cache -r tests/a2a/requirements.txt
  touch tests/a2a/.venv/.installed
fi
if [ ! -f tests/a2a/node_modules/.package-lock.json ] \
   || [ tests/a2a/package-lock.json -nt tests/a2a/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/a2a"
  (cd tests/a2a && npm ci --no-audit --no-fund --loglevel=error \
    --cache /var/tmp/agent-runtime-tools/npm-cache)
fi

# The official OpenAI SDKs for brain/tests/all/openai.rs: openai (PyPI) in
# tests/openai/.venv and openai (npm) in tests/openai/node_modules; downloads cached under
# /var/tmp as for the A2A clients.
if [ ! -f tests/openai/.venv/.installed ] \
   || [ tests/openai/requirements.txt -nt tests/openai/.venv/.installed ]; then
  ensure_venv_module
  echo "test-deps: openai in tests/openai/.venv"
  [ -x tests/openai/.venv/bin/pip ] || python3 -m venv tests/openai/.venv
  tests/openai/.venv/bin/pip install -q --disable-pip-version-check \
    --cache-dir /var/tmp/agent-runtime-tools/pip-cache -r tests/openai/requirements.txt
  touch tests/openai/.venv/.installed
fi
if [ ! -f tests/openai/node_modules/.package-lock.json ] \
   || [ tests/openai/package-lock.json -nt tests/openai/node_modules/.package-lock.json ]; then
  echo "test-deps: npm ci in tests/openai"
  (cd tests/openai && npm ci --no-audit --no-fund --loglevel=error \
    --cache /var/tmp/agent-runtime-tools/npm-cache)
fi

# s3s-fs: a real S3-protocol server (checks SigV4 signatures) for brain/tests/all/artifacts.rs.
# Cached outside the clone so CI's fresh clone reuses it. 0.15+ needs a newer rustc.
tools_root=/var/tmp/agent-runtime-tools
if [ ! -x "$tools_root/bin/s3s-fs" ]; then
  echo "test-deps: cargo install s3s-fs@0.14.1 into $tools_root (about 3 min, once)"
  build_dir="$(mktemp -d)"
  trap 'rm -rf "$build_dir"' EXIT
  # A target directory of its own: not the workspace's shared build cache.
  cargo install --root "$tools_root" --target-dir "$build_dir" \
    s3s-fs@0.14.1 --locked --features binary --quiet
fi

# Debian's PgBouncer (1.18) for the tests that reach Postgres through a transaction pooler
# (O5: brain/tests/all/pooler.rs, and the subset `make test` runs with
# TEST_THROUGH_PGBOUNCER=1), which start one of their own per test and fail rather than
# skip without it. Where apt would start the package's daemon (a host with systemd), it is
# stopped and disabled again: the tests need the binary only.
if [ ! -x /usr/sbin/pgbouncer ]; then
  echo "test-deps: installing pgbouncer from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
  if [ -d /run/systemd/system ]; then
    $sudo_ systemctl disable --now pgbouncer >/dev/null 2>&1 || true
  fi
fi

# The openssl command, with which the Redis TLS test (brain/tests/all/redis_tls.rs) makes
# its CA and the server's certificate. Present on most Debian hosts; installed if not.
if ! command -v openssl >/dev/null; then
  echo "test-deps: installing openssl from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi

# Debian's Chromium for the worker's browser tests (worker/tests/all/browser.rs), which fail
# rather than skip without it. About 30 s, once.
if [ ! -x /usr/bin/chromium ]; then
  echo "test-deps: installing chromium from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

# Debian's bubblewrap: the local launcher confines every worker with it, and the
# tests that start a runtime-manager launch workers through it; without it every launch
# fails confinement_unavailable. Tiny, once.
if ! command -v bwrap >/dev/null; then
  echo "test-deps: installing bubblewrap from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi

# promtool (Debian's prometheus package) for the metrics tests (brain/tests/all/metrics.rs,
# runtime-manager/tests/all/metrics.rs), which pipe each scrape through `promtool check metrics`
# and fail rather than skip without it. Only promtool is wanted: where apt would start the
# package's daemon (a host with systemd), it is stopped and disabled again. About 20 MB, once.
if ! command -v promtool >/dev/null; then
  echo "test-deps: installing prometheus (for promtool) from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
  if [ -d /run/systemd/system ]; then
    $sudo_ systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi

# kubernetes-validate (PyPI, schemas bundled, offline) for runtime-manager/tests/all/render_job.rs,
# which checks every rendered worker Job against the Kubernetes OpenAPI schema and fails
# rather than skips without it.
if [ ! -f tests/k8s/.venv/.installed ] \
   || [ tests/k8s/requirements.txt -nt tests/k8s/.venv/.installed ]; then
  ensure_venv_module
  echo "test-deps: kubernetes-validate in tests/k8s/.venv"
  [ -x tests/k8s/.venv/bin/pip ] || python3 -m venv tests/k8s/.venv
  tests/k8s/.venv/bin/pip install -q --disable-pip-version-check -r tests/k8s/requirements.txt
  touch tests/k8s/.venv/.installed
fi

# schemathesis (PyPI) for brain/tests/all/contract.rs, which fuzzes the live brain through its
# OpenAPI contract and fails rather than skips without it. The virtualenv sits outside the
# clone, named by the hash of the pinned requirements, so CI's fresh clone reuses it and a
# change of pins installs a new one beside it. The test derives the same path.
st_requirements=tests/contract/requirements.txt
st_venv="$tools_root/schemathesis-$(sha256sum "$st_requirements" | cut -c1-16)"
if [ ! -f "$st_venv/.installed" ]; then
  ensure_venv_module
  echo "test-deps: schemathesis into $st_venv"
  rm -rf "$st_venv"
  python3 -m venv "$st_venv"
  "$st_venv/bin/pip" install -q --disable-pip-version-check -r "$st_requirements"
  touch "$st_venv/.installed"
fi
