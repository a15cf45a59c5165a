#!/usr/bin/env bash
# `make bench-compare BASE=<rev>`: the bench of <rev> and of this checkout, back to back on
# this machine, and one table with both side by side and the ratio new/base per cell
# (docs/PERFORMANCE.md).
#
# <rev> is built in release in a git worktree under /var/tmp with a target directory of
# its own, both kept for the next run (a first run seeds that target directory with a copy
# of this checkout's release build, so only what differs is compiled). BENCH_ONLY
# (default cpu,turn), BENCH_SECONDS and the bench's other variables reach both runs alike.
# Only the packages the scenarios need are built (the bench and the brain; the
# runtime-manager and the worker for hands, snapshots, speculation, hangup).
#
# A scenario <rev>'s bench does not know (cpu, before it existed) is run by this checkout's
# bench against <rev>'s binaries (brain, runtime-manager, worker): the harness is the same
# on both sides and only the system measured differs. That works for the scenarios that
# run the brain as its own process; an in-process one that <rev> lacks has no base column.
#
# Each run's tables and rows are kept under $BENCH_COMPARE_DIR/runs/<time>/.
set -euo pipefail
cd "$(dirname "$0")/.."

base=${BASE:?usage: make bench-compare BASE=<rev>}
base_sha=$(git rev-parse --verify --quiet "$base^{commit}") ||
  { echo "bench-compare: '$base' is not a commit of this repository" >&2; exit 1; }
only=${BENCH_ONLY:-cpu,turn}
root=${BENCH_COMPARE_DIR:-/var/tmp/agent-runtime-bench-compare}
worktree=$root/base-src
base_target=$root/base-target
out=$root/runs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"

target_of() { # the target directory cargo uses in directory $1
  (cd "$1" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
}

# What the scenarios run: the bench and the brain, and the hands' runtime-manager and worker
# only when a hands scenario is asked for (k8s-openapi alone is minutes of a release build).
packages=(-p bench -p brain)
case ",$only," in
  *,hands,* | *,snapshots,* | *,speculation,* | *,hangup,*) packages+=(-p runtime-manager -p worker) ;;
esac

echo "bench-compare: building this checkout ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ', with uncommitted changes'))"
cargo build --release --locked "${packages[@]}"
new_bin=$(target_of .)/release

echo "bench-compare: building $base ($(git rev-parse --short "$base_sha")) in $worktree"
if git -C "$worktree" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$worktree" checkout --quiet --detach --force "$base_sha"
else
  rm -rf "$worktree"
  git worktree prune
  git worktree add --quiet --detach "$worktree" "$base_sha"
fi
if [ ! -d "$base_target/release" ]; then
  mkdir -p "$base_target"
  cp -a "$new_bin" "$base_target/"
fi

# Which of the scenarios asked for the base's own bench knows.
known=() unknown=()
for s in ${only//,/ }; do
  if git show "$base_sha:bench/src/main.rs" | grep -q "wants(\"$s\")"; then
    known+=("$s")
  else
    unknown+=("$s")
  fi
done
join() { local IFS=,; echo "$*"; }

# The same packages on both sides: a different selection would resolve the dependencies'
# features differently and rebuild them.
(cd "$worktree" && CARGO_TARGET_DIR=$base_target cargo build --release --locked "${packages[@]}")
base_bin=$base_target/release

base_tables=()
if [ ${#known[@]} -gt 0 ]; then
  echo "bench-compare: base bench, BENCH_ONLY=$(join "${known[@]}")"
  BENCH_ONLY=$(join "${known[@]}") BENCH_TSV=$out/base.tsv "$base_bin/bench" | tee "$out/base.md"
  # A base bench from before BENCH_TSV prints only the markdown table.
  if [ -s "$out/base.tsv" ]; then base_tables+=("$out/base.tsv"); else base_tables+=("$out/base.md"); fi
fi
if [ ${#unknown[@]} -gt 0 ]; then
  echo "bench-compare: this bench against the base's binaries, BENCH_ONLY=$(join "${unknown[@]}")"
  harness=$out/base-bin
  mkdir -p "$harness"
  for b in brain runtime-manager worker; do
    if [ -e "$base_bin/$b" ]; then cp "$base_bin/$b" "$harness/"; fi
  done
  cp "$new_bin/bench" "$harness/"
  BENCH_ONLY=$(join "${unknown[@]}") BENCH_TSV=$out/base-harness.tsv "$harness/bench" |
    tee "$out/base-harness.md"
  base_tables+=("$out/base-harness.tsv")
fi

echo "bench-compare: this checkout's bench, BENCH_ONLY=$only"
BENCH_ONLY=$only BENCH_TSV=$out/new.tsv "$new_bin/bench" | tee "$out/new.md"

echo
echo "bench-compare: base $base ($(git rev-parse --short "$base_sha")) vs this checkout; ratio = new / base; tables in $out"
echo
python3 - "$out/new.tsv" "${base_tables[@]}" <<'EOF'
"""Both benches' rows side by side, keyed by (scenario, metric), with the ratio new/base
per cell. A cell's figure is its first number and the unit word after it ("1.234 ms",
"412 turns/s", "12.00"); the ratio is given only when both sides have a figure in the
same unit and the base's is not zero. The rest of a cell is in the saved tables."""
import re
import sys

NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*([A-Za-z%/]+)?")


def rows_of(path):
    """(scenario, metric, p50, p99, other) rows of a BENCH_TSV file or a markdown table."""
    rows = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if path.endswith(".tsv"):
        for line in lines[1:]:
            cells = line.split("\t")
            if len(cells) == 5:
                rows.append(cells)
        return rows
    for line in lines:
        if not line.startswith("|") or line.startswith("|-"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[:2] != ["scenario", "metric"]:
            rows.append(cells)
    return rows


def keyed(rows):
    out, seen = {}, {}
    for r in rows:
        key = (r[0], r[1])
        n = seen.get(key, 0)
        seen[key] = n + 1
        out[key + (n,)] = r
    return out


def figure(cell):
    m = NUMBER.search(cell)
    return (float(m.group(1)), m.group(2) or "", m.group(0).strip()) if m else None


def ratio(base, new):
    if base is None or new is None or base[1] != new[1] or base[0] == 0:
        return ""
    return f"{new[0] / base[0]:.2f}"


new = keyed(rows_of(sys.argv[1]))
base = {}
for path in sys.argv[2:]:
    base.update(keyed(rows_of(path)))
order = list(new) + [k for k in base if k not in new]
header = ["scenario", "metric"]
for col in ("p50", "p99", "other"):
    header += [f"{col} base", f"{col} new", "new/base"]
table = [header]
for key in order:
    b, n = base.get(key), new.get(key)
    line = [key[0], key[1]]
    for i in (2, 3, 4):
        fb = figure(b[i]) if b else None
        fn = figure(n[i]) if n else None
        line += [fb[2] if fb else "", fn[2] if fn else "", ratio(fb, fn)]
    table.append(line)
widths = [max(len(r[i]) for r in table) for i in range(len(header))]
for j, r in enumerate(table):
    print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    if j == 0:
        print("|-" + "-|-".join("-" * w for w in widths) + "-|")
EOF
