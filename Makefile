# The two commands a fresh machine needs: `make dev` runs the system, `make test` runs
# everything CI checks. Both do their own set-up (services, npm packages).

# The build cache lives outside the clone (see .cargo/config.toml) so CI's fresh clone
# rebuilds incrementally.
export CARGO_TERM_COLOR ?= never

NEXTEST := $(shell cargo nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: dev test services test-deps web helm fmt lint unit pooler bench bench-compare bench-peer bench-soak

dev: services
	@scripts/dev.sh

test: services test-deps web helm lint unit pooler

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

# O5: the tests that matter run again with every brain (and runtime-manager) of a test
# reaching its database through a PgBouncer of its own in transaction mode (Debian's 1.18,
# from test-deps), Postgres itself only for migrations and LISTEN (DATABASE_DIRECT_URL).
POOLER_TESTS := /^(turn|hold_turns|queue|quotas|events|stop|autostart|retention)::/
POOLER_MORE := /^(auth::.*revoked|workers::a_shell_call_provisions_a_worker)/
pooler:
ifeq ($(NEXTEST),yes)
	TEST_THROUGH_PGBOUNCER=1 cargo nextest run -p brain --test all --locked --no-fail-fast \
	  -E 'test($(POOLER_TESTS)) | test($(POOLER_MORE))'
else
	TEST_THROUGH_PGBOUNCER=1 cargo test -p brain --test all --locked --no-fail-fast -- \
	  turn:: hold_turns:: queue:: quotas:: events:: stop:: autostart:: retention:: \
	  auth::a_revoked workers::a_shell_call_provisions_a_worker
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

# The soak (docs/PERFORMANCE.md): 1,000 chats x 10 turns at concurrency 64 over two brain
# processes, with Redis blips and one replica SIGKILLed and restarted; prints what became
# of every turn and fails if one was lost, duplicated or left running. Not part of `test`.
bench-soak: services
	cargo build --release --locked --bins
	BENCH_ONLY=soak "$$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/bench"
