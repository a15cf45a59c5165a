#!/usr/bin/env bash
# `make bench-first-token`: where the brain's time to a turn's first token goes when each
# turn finds it idle (docs/design/performance-history.md: an idle brain's first token,
# split). Runs the bench's `quiet` open loop (BENCH_QUIET_RATE, default 5 turns/s) and,
# while its brain turns are measured, a
# `perf trace` of the socket system calls of the brain and of the bench (the client and the
# scripted provider); then scripts/first-token-split.py charges each turn's time to what
# the brain waits on. Needs `perf` and the right to trace (root, or perf_event_paranoid
# <= 1 with the processes one's own).
#
# The trace slows each system call it sees, so the bench's own table printed with it reads
# higher than a run without it: the split is what this is for. BENCH_TRACE_SECONDS
# (default 20) is how long the trace runs; BENCH_TRACE_KEEP=1 keeps the trace and the
# socket table (the directory is printed).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${BENCH_TRACE_SECONDS:-20}
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
work=$(mktemp -d /var/tmp/bench-first-token.XXXXXX)
bench=
tracer=
cleanup() {
  [ -n "$tracer" ] && kill -INT "$tracer" 2>/dev/null || true
  [ -n "$bench" ] && kill "$bench" 2>/dev/null || true
  if [ -n "${BENCH_TRACE_KEEP:-}" ]; then echo "bench-first-token: the trace is in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

BENCH_ONLY=quiet "$target/release/bench" >"$work/bench.out" 2>"$work/bench.err" &
bench=$!
bench_pid=$bench
until grep -q "brain pid" "$work/bench.err"; do
  if ! kill -0 "$bench" 2>/dev/null; then
    cat "$work/bench.err" >&2
    echo "bench-first-token: the bench ended before its quiet loop started" >&2
    exit 1
  fi
  sleep 0.2
done
brain=$(sed -n 's/.*brain pid \([0-9]*\).*/\1/p' "$work/bench.err")
# Past the open loop's one-second warm-up, into the brain's measured window.
sleep 2
perf trace -p "$brain,$bench" -o "$work/trace" \
  -e recvfrom,sendto,read,write,readv,writev,epoll_wait,epoll_pwait &
tracer=$!
sleep 2
ss -tanpH >"$work/sockets"
for pid in "$brain" "$bench"; do ls "/proc/$pid/task" >"$work/sockets.tasks.$pid"; done
sleep $((seconds - 2))
kill -INT "$tracer"
wait "$tracer" || true
tracer=
wait "$bench"
bench=
cat "$work/bench.out"
python3 scripts/first-token-split.py "$work/trace" "$work/sockets" "$brain" "$bench_pid"
