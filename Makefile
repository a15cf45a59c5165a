# The two commands a fresh machine needs: `make dev` runs the system, `make test` runs
# everything CI checks. Both do their own set-up (services, npm packages).

# The build cache lives outside the clone (see .cargo/config.toml) so CI's fresh clone
# rebuilds incrementally.
export CARGO_TERM_COLOR ?= never

NEXTEST := $(shell cargo nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: dev test services test-deps web helm fmt lint unit pooler cluster bench bench-compare bench-peer bench-soak bench-pg bench-first-token

dev: services
	@scripts/dev.sh

test: services test-deps web helm lint unit pooler cluster

services:
	@scripts/services.sh

test-deps:
	@scripts/test-deps.sh

# Rebuilds the web chat (web/) and fails if the committed build in web/dist, which the brain
# embeds, differs from what the sources give.
web:
	cd web && npm run build --silent >/dev/null
	@git diff --exit-code --stat -- web/dist && test -z "$$(git status --porcelain -- web/dist)" \
	  || { echo "web/dist is out of date: run 'cd web && npm run build' and commit it"; exit 1; }

# Renders the Helm chart (helm/agent-runtime) with its default values and every value set in
# helm/agent-runtime/ci/, lints it, validates every manifest (kubernetes-validate --strict,
# checkov), and fails if the committed default render in k8s/ differs from the chart's.
helm:
	@scripts/helm-check.sh

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

unit:
ifeq ($(NEXTEST),yes)
	cargo nextest run --workspace --locked --no-tests=pass --no-fail-fast
else
	cargo test --workspace --locked --no-fail-fast
endif

# The subsets below (`pooler`, `cluster`) build exactly what `unit` built: `-p brain` alone
# would resolve the dependencies' features for one package and compile about seventy of
# them a second time. They take the whole workspace and pick their tests: nextest with a
# filterset, `cargo test` with `--test <target>` (the `all` binaries of every package that
# has one) and libtest's name filters, which only brain's test names match.

# O5: the tests that matter run again with every brain (and runtime-manager) of a test
# reaching its database through a PgBouncer of its own in transaction mode (Debian's 1.18,
# from test-deps), Postgres itself only for migrations and LISTEN (DATABASE_DIRECT_URL).
POOLER_TESTS := /^(turn|hold_turns|queue|quotas|events|stop|autostart|retention|soak)::/
POOLER_MORE := /^(auth::.*revoked|workers::a_shell_call_provisions_a_worker)/
pooler:
ifeq ($(NEXTEST),yes)
	TEST_THROUGH_PGBOUNCER=1 cargo nextest run --workspace --locked --no-fail-fast \
	  -E 'binary_id(brain::all) & (test($(POOLER_TESTS)) | test($(POOLER_MORE)))'
else
	TEST_THROUGH_PGBOUNCER=1 cargo test --workspace --test all --locked --no-fail-fast -- \
	  turn:: hold_turns:: queue:: quotas:: events:: stop:: autostart:: retention:: soak:: \
	  auth::a_revoked workers::a_shell_call_provisions_a_worker
endif

# O5: the tests that matter on a Redis Cluster (turns, holds, quotas, events, stop,
# revocation, a worker through the queue and one relayed across replicas, autostart, the
# soak's short form, the queue's own), run again with every brain, runtime-manager and
# queue on the shared three-master cluster on loopback, which the first of them starts
# (test-support/src/redis_cluster.rs). The cluster-only tests (failover, TLS with a
# password) run in `unit` (brain/tests/all/cluster.rs).
CLUSTER_BRAIN_TESTS := \
	turn::an_openai_turn_streams_and_persists \
	hold_turns::a_second_turn_for_a_busy_agent_gets_agent_busy_at_once \
	hold_turns::two_concurrent_messages_give_one_stream_and_one_409 \
	quotas::turns_per_minute_refuses_the_next_turn_before_anything_is_written \
	quotas::concurrent_turns_refuses_a_second_agent_while_the_first_runs \
	quotas::fifty_concurrent_turns_overshoot_a_token_budget_by_at_most_one_reservation \
	rate_limits::each_key_has_its_teams_request_rate_shared_by_every_replica \
	events::an_observer_on_another_replica_sees_every_chunk_of_a_turn_in_order \
	events::a_reconnect_gets_exactly_the_missed_events_then_live \
	events::a_running_turn_is_resumed_from_its_start_on_another_replica \
	stop::a_turn_on_one_replica_is_stopped_from_another_within_milliseconds \
	auth::a_revoked_key_is_refused_on_every_replica_within_a_second \
	auth::a_revoked_keys_open_streams_close_on_every_replica_within_a_second \
	workers::a_shell_call_provisions_a_worker_reuses_it_and_idle_ends_it \
	workers::a_worker_on_replica_a_serves_a_turn_on_replica_b \
	autostart::a_per_second_cadence_fires_turns_that_complete_in_the_autostart_chat \
	autostart::two_replicas_fire_each_tick_exactly_once \
	soak::a_short_soak_over_two_replicas_and_a_kill_loses_no_turn_and_stores_none_twice

cluster:
ifeq ($(NEXTEST),yes)
	TEST_REDIS_CLUSTER=1 cargo nextest run --workspace --locked --no-fail-fast \
	  -E 'binary_id(brain::all)' -- --exact $(CLUSTER_BRAIN_TESTS)
	TEST_REDIS_CLUSTER=1 cargo nextest run --workspace --locked --no-fail-fast \
	  -E 'binary_id(queue::queue)'
else
	TEST_REDIS_CLUSTER=1 cargo test --workspace --test all --locked --no-fail-fast -- \
	  --exact $(CLUSTER_BRAIN_TESTS)
	TEST_REDIS_CLUSTER=1 cargo test --workspace --test queue --locked --no-fail-fast
endif

# The bench harness (docs/PERFORMANCE.md): every binary in release (the bench starts the
# release runtime-manager and worker next to itself), then one table. Not part of `test`.
# The binary is run from the target directory: `cargo run -p bench` would resolve features
# for that one package and rebuild the dependencies a second time.
bench: services
	cargo build --release --locked --bins
	"$$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/bench"

# Before and after on one machine (docs/PERFORMANCE.md): builds BASE in release in a worktree
# under /var/tmp (its own target directory, kept), builds this checkout, runs both benches
# back to back (BENCH_ONLY, default cpu,turn, and BENCH_SECONDS reach both) and prints both
# tables side by side with the ratio new/base per cell. Not part of `test`.
bench-compare: services
	@BASE="$(BASE)" scripts/bench-compare.sh

# The peer side by side (docs/PERFORMANCE.md): installs LangGraph's dev server into a
# virtualenv outside the clone, then measures its turn overhead and the brain's in one run
# against the same scripted provider and prints the ratio. Not part of `test`.
bench-peer: services
	@scripts/bench-peer.sh

# A turn's writes in Postgres alone, part by part (docs/PERFORMANCE.md): pgbench replays
# them against a scratch database, whole and with each part left out. Not part of `test`.
bench-pg: services
	cargo build --release --locked -p brain
	@scripts/bench-pg-writes.sh

# Where the brain's time to a first token goes when each turn finds it idle
# (docs/PERFORMANCE.md): the bench's quiet open loop under `perf trace`, split by what the
# brain waits on. Needs perf and the right to trace. Not part of `test`.
bench-first-token: services
	cargo build --release --locked --bins
	@scripts/bench-first-token.sh

# The soak (docs/PERFORMANCE.md): 1,000 chats x 10 turns at concurrency 64 over two brain
# processes, with Redis blips and one replica SIGKILLed and restarted; prints what became
# of every turn and fails if one was lost, duplicated or left running. Not part of `test`.
bench-soak: services
	cargo build --release --locked --bins
	BENCH_ONLY=soak "$$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/bench"
