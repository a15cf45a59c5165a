#!/usr/bin/env bash
# The Helm chart's check (make helm, part of make test): renders helm/agent-runtime with
# its default values and every value set in helm/agent-runtime/ci/, lints it strictly, runs
# every manifest through kubernetes-validate --strict and checkov, and fails if k8s/ (the
# committed default render) differs. `scripts/helm-check.sh --write` rewrites k8s/.
#
# No helm binary exists for these machines: helm-python-sdk carries Helm's SDK. The tools
# are installed from PyPI into a virtualenv outside the clone, named by the hash of the
# pinned helm/requirements.txt, so a fresh clone reuses it; after that it runs offline.
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=helm/requirements.txt
venv="/var/tmp/agent-runtime-tools/helm-$(sha256sum "$requirements" | cut -c1-16)"
if [ ! -f "$venv/.installed" ]; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "helm-check: installing python3-venv from Debian packages"
    if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
    $sudo_ apt-get update -qq
    $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  echo "helm-check: installing the chart tools into $venv (about a minute, once)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
  touch "$venv/.installed"
fi

exec "$venv/bin/python" helm/check.py "$@"
