#!/usr/bin/env bash
# `make dev`: builds, migrates, and runs the runtime-manager and the brain with the
# embedded defaults on http://127.0.0.1:8080. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --bins
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin="$target_dir/debug"

"$bin/brain" migrate

"$bin/runtime-manager" &
manager=$!
trap 'kill $manager 2>/dev/null || true' EXIT

addr=${BRAIN_ADDR:-127.0.0.1:8080}
cat <<MSG

  The brain is starting on http://$addr$( [ -z "${OPENAI_API_KEY:-}${ANTHROPIC_API_KEY:-}" ] && echo " with the offline demo model" ).
  In another terminal:

    KEY=\$($bin/brain admin create-team demo | python3 -c 'import json,sys; print(json.load(sys.stdin)["api_key"])')
    AGENT=\$(curl -s http://$addr/v1/agents -H "Authorization: Bearer \$KEY" -H 'content-type: application/json' \\
      -d '{"name":"helper","system_prompt":"You are helpful.","model":"openai/gpt-4o-mini"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    CHAT=\$(curl -s -X POST http://$addr/v1/agents/\$AGENT/chats -H "Authorization: Bearer \$KEY" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    curl -N http://$addr/v1/chats/\$CHAT/messages -H "Authorization: Bearer \$KEY" -H 'content-type: application/json' \\
      -d '{"content":"Hello!"}'

MSG
"$bin/brain" serve
