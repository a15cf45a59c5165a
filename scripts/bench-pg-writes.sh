#!/usr/bin/env bash
# `make bench-pg`: what a no-tool turn's writes cost Postgres alone, part by part
# (docs/design/performance-history.md: the writes, part by part). No brain runs: pgbench
# replays the turn's writes against a scratch database migrated by `brain migrate`, once
# whole and once with each part left out, so a part's cost is the difference.
#
# The statements copy the shapes of `Store::begin_turn`'s writes and of `finish_turn_text`
# (store/src/turns.rs) with literals where the brain binds values; a change there
# wants the same change here. The scratch database is made through BENCH_DATABASE_URL
# (the bench's admin URL, default the local Postgres) and dropped at the end.
#
# Every variant runs at concurrency 8 on pgbench's prepared protocol (as sqlx does), with
# `synchronous_commit = off` so that the figure is CPU and not the WAL flush's wait,
# BENCH_PG_SECONDS (default 8) a run, three runs alternated, the median kept. "machine µs a script" is the cores over the transactions a second: pgbench
# itself is in it, but it does the same work in every variant, so a difference between
# two variants is Postgres'.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${BENCH_PG_SECONDS:-8}
admin=${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=bench_pg_writes
url=${admin%/*}/$db
work=$(mktemp -d /var/tmp/bench-pg-writes.XXXXXX)
trap 'rm -rf "$work"; psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

psql -q "$admin" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
DATABASE_URL=$url "$target/release/brain" migrate >/dev/null

team=00000000-0000-0000-0000-000000000001
agent=00000000-0000-0000-0000-0000000000a1
replica=00000000-0000-0000-0000-0000000000f1
hash="\\x$(printf '01%.0s' $(seq 32))"
psql -q "$url" <<EOF
INSERT INTO teams (id, name) VALUES ('$team', 't');
INSERT INTO agents (id, team_id, name, system_prompt, model) VALUES ('$agent', '$team', 'a', 'p', 'm');
INSERT INTO chats (id, team_id, agent_id)
  SELECT ('00000000-0000-0000-0001-' || lpad(g::text, 12, '0'))::uuid, '$team', '$agent'
  FROM generate_series(1, 100) g;
INSERT INTO compositions (team_id, hash, body) VALUES ('$team', '$hash', '{}');
EOF

# The intake's writes: the turn and its user message (the brain's one statement adds the
# basis check and the history read to these).
cat >"$work/intake.sql" <<EOF
\set c random(1, 100)
SELECT gen_random_uuid() AS tid, gen_random_uuid() AS umid, gen_random_uuid() AS amid, gen_random_uuid() AS bid, ('00000000-0000-0000-0001-' || lpad(:c::text, 12, '0')) AS chat \gset
INSERT INTO turns (id, team_id, agent_id, chat_id, trigger, status, composition_hash, replica_id, background, actor, actor_admin) VALUES (:tid, '$team', '$agent', :chat, 'user', 'running', '$hash', '$replica', false, 'key-x', false);
INSERT INTO messages (id, team_id, chat_id, turn_id, role, parts, status, client_message_id) VALUES (:umid, '$team', :chat, :tid, 'user', '[{"type":"text","text":"hello"}]', 'complete', :umid);
EOF

# The end statement's CTEs (`finish_turn_text`) for a plain completed turn: one model call
# billed, no approval, the user message kept, one webhook event (no webhook subscribed).
# `end` is the text the brain sends for it; `end-all-ctes` adds the withdrawal and the
# approvals (writing nothing here), as every end statement carried them before they were
# left out of the turns that need none.
declare -A cte
cte[t]="t AS ( UPDATE turns SET status = 'completed', error_code = NULL, finished_at = now() WHERE team_id = '$team' AND id = :tid AND replica_id = '$replica' RETURNING id)"
cte[m]="m AS ( INSERT INTO messages (id, team_id, chat_id, turn_id, role, parts, status) SELECT :amid, '$team', :chat, :tid, 'assistant', '[{\"type\":\"text\",\"text\":\"hi there\"}]', 'complete' FROM t WHERE :amid::uuid IS NOT NULL)"
cte[u]="u AS ( INSERT INTO billing_events (id, team_id, agent_id, turn_id, event_key, kind, model, input_tokens, output_tokens) SELECT u.id, '$team', '$agent', :tid, u.key, 'model_call', u.model, u.input, u.output FROM unnest(ARRAY[:bid]::uuid[], ARRAY['turn-' || :tid]::text[], ARRAY['m']::text[], ARRAY[10]::int8[], ARRAY[20]::int8[]) AS u(id, key, model, input, output) WHERE EXISTS (SELECT 1 FROM t) ON CONFLICT (event_key) DO NOTHING)"
cte[w]="w AS ( DELETE FROM messages WHERE team_id = '$team' AND turn_id = :tid AND role = 'user' AND false AND EXISTS (SELECT 1 FROM t))"
cte[a]="a AS ( INSERT INTO approvals (id, team_id, agent_id, chat_id, turn_id, message_id, part_index, tool_call_id, tool, input, state, expires_at) SELECT a.id, '$team', '$agent', :chat, :tid, :amid, a.idx, a.call, a.tool, a.input, 'pending', a.exp FROM unnest('{}'::uuid[], '{}'::int4[], '{}'::text[], '{}'::text[], '{}'::jsonb[], '{}'::timestamptz[]) AS a(id, idx, call, tool, input, exp) WHERE EXISTS (SELECT 1 FROM t))"
cte[o]="o AS (INSERT INTO webhook_deliveries (id, team_id, webhook_id, event, event_key, payload) SELECT gen_random_uuid(), w.team_id, w.id, e.event, e.key, e.payload FROM unnest(ARRAY['turn.completed']::text[], ARRAY['k' || :tid]::text[], ARRAY['{}']::jsonb[]) AS e(event, key, payload) JOIN webhooks w ON w.team_id = '$team' AND e.event = ANY(w.events) WHERE EXISTS (SELECT 1 FROM t) AND (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries p WHERE p.webhook_id = w.id AND p.state = 'pending' LIMIT 10000) n) < 10000 ON CONFLICT DO NOTHING)"
end_of() { # the intake, then the end statement with the CTEs named in $2
  local ctes=() name
  for name in $2; do ctes+=("${cte[$name]}"); done
  local IFS=,
  { cat "$work/intake.sql"; echo "WITH ${ctes[*]} SELECT now(), EXISTS (SELECT 1 FROM t);"; } >"$work/$1.sql"
}
end_of end-all-ctes "t m u w a o"
end_of end "t m u o"
end_of end-no-webhooks "t m u"
end_of end-no-billing "t m o"
end_of end-update-only "t"
echo 'SELECT 1;' >"$work/select1.sql"
# The queue probe each turn's end kicks (`Store::next_queued`).
echo "SELECT q.id, q.chat_id, q.actor, q.actor_admin, (SELECT coalesce(string_agg(p->>'text', ''), '') FROM messages m, jsonb_array_elements(m.parts) p WHERE m.team_id = q.team_id AND m.turn_id = q.id AND m.role = 'user') AS content FROM turns q WHERE q.team_id = '$team' AND q.agent_id = '$agent' AND q.status = 'queued' ORDER BY q.queued_at, q.id LIMIT 1;" >"$work/probe.sql"

cores=$(nproc)
tps() { # one run of variant $1: its transactions a second, or the run's output and failure
  local out
  out=$(PGOPTIONS='-c synchronous_commit=off' pgbench -n -M prepared -c 8 -j 2 -T "$seconds" \
    -f "$work/$1.sql" "$url" 2>&1) || true
  if ! sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | grep .; then
    echo "bench-pg: pgbench failed on $1:" >&2
    echo "$out" >&2
    return 1
  fi
}
measure() { # variant... -> one row per variant: the median of three alternated runs
  local -A runs=()
  local round v t
  for round in 1 2 3; do
    for v in "$@"; do
      t=$(tps "$v") || exit 1
      runs[$v]+="$t "
    done
  done
  for v in "$@"; do
    python3 - "$v" "$cores" ${runs[$v]} <<'EOF'
import statistics, sys
name, cores, runs = sys.argv[1], int(sys.argv[2]), [float(x) for x in sys.argv[3:]]
m = statistics.median(runs)
print(f"| {name} | {m:,.0f} ({min(runs):,.0f}-{max(runs):,.0f}) | {cores * 1e6 / m:,.0f} |")
EOF
  done
}

echo "| script (concurrency 8, ${seconds} s, median of 3) | transactions/s (range) | machine µs a script |"
echo "|---|---|---|"
measure select1 probe intake end-all-ctes end end-no-webhooks end-no-billing end-update-only
psql -q "$url" -c "VACUUM ANALYZE turns" -c "DROP INDEX turns_chat, turns_running, turns_running_replica, turns_team_running, turns_team_started, turns_queued, turns_agent_started, turns_team_finished"
echo "| *without turns' eight secondary indexes:* | | |"
measure intake end
