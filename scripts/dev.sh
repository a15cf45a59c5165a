#!/usr/bin/env bash
# `make dev`: builds, migrates, and runs the runtime-manager and the brain with the
# embedded defaults on http://127.0.0.1:8080, then makes sure a demo team, its key and an
# agent with hands exist (idempotent: the key is kept in .dev/demo-key, which only this
# machine reads) and prints the web chat's link. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."

# DEV_BIN names a directory of binaries already built, used instead of building: the test
# of this script (brain/tests/all/web_chat.rs) runs it with the binaries the tests built.
if [ -n "${DEV_BIN:-}" ]; then
  bin=$DEV_BIN
else
  cargo build --bins
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  bin="$target_dir/debug"
fi

# Development mode: without a SESSION_TOKEN_KEY of yours, the brain and the manager sign
# and check worker tokens with the key made once in .dev/session-token-key (gitignored).
export AGENT_RUNTIME_DEV=true

# The manager confines every worker with bubblewrap (docs/OPERATIONS.md, "Local workers,
# confined"): installed from Debian packages when missing, as services.sh does its own.
# RUNTIME_MANAGER_LOCAL_UNCONFINED=true runs workers unconfined instead.
if ! command -v bwrap >/dev/null && [ "${RUNTIME_MANAGER_LOCAL_UNCONFINED:-}" != true ]; then
  echo "dev: installing bubblewrap from Debian packages"
  if [ "$(id -u)" = 0 ]; then sudo_=""; else sudo_=sudo; fi
  $sudo_ apt-get update -qq
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi

"$bin/brain" migrate

"$bin/runtime-manager" &
manager=$!
"$bin/brain" serve &
brain=$!
# On exit (Ctrl-C included) the two are stopped and waited for: a brain still draining
# would hold the port of the next `make dev`.
trap 'kill $manager $brain 2>/dev/null || true; wait $manager $brain 2>/dev/null || true' EXIT

addr=${BRAIN_ADDR:-127.0.0.1:8080}
api="http://$addr"
for _ in $(seq 1 100); do
  curl -sf --max-time 1 "$api/healthz" >/dev/null && break
  kill -0 $brain 2>/dev/null || { echo "dev: the brain exited"; exit 1; }
  sleep 0.1
done

# The demo team's key: the one kept from an earlier start if the brain still accepts it
# (the database may have been reset since), else a new team's.
mkdir -p .dev
key_file=.dev/demo-key
key=""
if [ -s "$key_file" ]; then
  key=$(cat "$key_file")
  status=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$api/v1/agents" -H "Authorization: Bearer $key")
  [ "$status" = 200 ] || key=""
fi
if [ -z "$key" ]; then
  key=$("$bin/brain" admin create-team demo | python3 -c 'import json,sys; print(json.load(sys.stdin)["api_key"])')
  (umask 077 && printf '%s' "$key" > "$key_file")
fi

# An agent with hands, once.
agents=$(curl -sf --max-time 5 "$api/v1/agents" -H "Authorization: Bearer $key")
if ! printf '%s' "$agents" | python3 -c 'import json,sys; sys.exit(0 if any(a["name"]=="demo" for a in json.load(sys.stdin)["agents"]) else 1)'; then
  curl -sf --max-time 5 "$api/v1/agents" -H "Authorization: Bearer $key" -H 'content-type: application/json' \
    -d '{"name":"demo","system_prompt":"You are a helpful agent with a shell and files.","model":"openai/gpt-4o-mini","runtime_profile":"light"}' >/dev/null
fi

demo=$( [ -z "${OPENAI_API_KEY:-}${ANTHROPIC_API_KEY:-}" ] && echo " (offline demo model: no provider key is set)" )
cat <<MSG

  The web chat is ready$demo:

    http://$addr/

  Sign in with the key $key
  pick the agent "demo", press "New chat" and type:  run \`ls -la\`

  The API tour with curl (same key) is in README.md ("Quick tour").

MSG
wait $brain
