#!/usr/bin/env python3
"""Splits the brain's time to a turn's first token by what it waits on, from a `perf trace`
of the brain and the bench (`make bench-first-token`, docs/PERFORMANCE.md).

Usage: first-token-split.py TRACE SOCKETS BRAIN_PID BENCH_PID

TRACE is `perf trace -p BRAIN_PID,BENCH_PID` output of the socket system calls and
`epoll_wait`; SOCKETS is `ss -tanpH` taken while both ran, which names every socket's ends
(so a file descriptor is known as the client's, Postgres', Redis' or the provider's).

A turn is timed from the bench client's send of its POST to the client's read of the
write that carries the first text-delta: the brain's first write to the client after its
first read from the provider. Between the brain reading the request and that write, each
instant is charged to what the brain waits on: a store (Postgres, Redis) or the provider
from the brain's send to it until the read that brings its answer, otherwise the brain
itself (its CPU, and its threads waking). The medians are over turns, so the parts need
not add up to the median total exactly.
"""

import os
import re
import statistics
import sys
from collections import defaultdict
from urllib.parse import urlsplit

LINE = re.compile(
    r"^\s*(?P<ts>\d+\.\d+)\s+\(\s*(?P<dur>[\d.]+)\s+ms\):\s+(?P<comm>.*?)/(?P<tid>\d+)\s+"
    r"(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+)"
)
FD = re.compile(r"\bfd: (\d+)")
SENDS = {"sendto", "write", "writev", "sendmsg"}
RECVS = {"recvfrom", "read", "readv", "recvmsg"}
# Parts of a turn smaller than this on average (ms) are not printed.
SMALL = 0.02
USERS = re.compile(r'\("[^"]*",pid=(\d+),fd=(\d+)\)')


# Postgres and Redis are known by their ports, from the URLs the bench reads.
PG_PORT = urlsplit(os.environ.get("BENCH_DATABASE_URL", "postgres://127.0.0.1")).port or 5432
REDIS_PORT = urlsplit(os.environ.get("REDIS_URL", "redis://127.0.0.1")).port or 6379


def port(addr):
    return int(addr.rsplit(":", 1)[1])


def sockets(path, brain, bench):
    """(pid, fd) -> (local port, peer port) of both processes' connections, and each
    process' listening ports."""
    ends, listening = {}, {brain: set(), bench: set()}
    for line in open(path):
        fields = line.split()
        if len(fields) < 6:
            continue
        local, peer = port(fields[3]), fields[4]
        for pid, fd in USERS.findall(line):
            pid = int(pid)
            if pid not in listening:
                continue
            if fields[0] == "LISTEN":
                listening[pid].add(local)
            else:
                ends[(pid, int(fd))] = (local, port(peer))
    return ends, listening


def roles(ends, listening, brain, bench):
    """(pid, fd) -> role: client/provider on both sides, pg and redis on the brain's."""
    named = {}
    for (pid, fd), (local, peer) in ends.items():
        if pid == brain:
            if peer == PG_PORT:
                named[(pid, fd)] = "pg"
            elif peer == REDIS_PORT:
                named[(pid, fd)] = "redis"
            elif local in listening[brain]:
                named[(pid, fd)] = "client"
            elif peer in listening[bench]:
                named[(pid, fd)] = "provider"
        elif pid == bench:
            if peer in listening[brain]:
                named[(pid, fd)] = "client"
            elif local in listening[bench]:
                named[(pid, fd)] = "provider"
    return named


CONTINUED = re.compile(
    r"^\s*(?P<ts>\d+\.\d+)\s+\(\s*(?P<dur>[\d.]+)\s+ms\):\s+(?P<comm>.*?)/(?P<tid>\d+)\s+"
    r"\.\.\. \[continued\]: (?P<call>\w+)\(\)\)\s+=\s+(?P<ret>-?\d+)"
)
UNFINISHED = re.compile(
    r"^\s*(?P<ts>\d+\.\d+)\s+\(\s*\):\s+(?P<comm>.*?)/(?P<tid>\d+)\s+"
    r"(?P<call>\w+)\((?P<args>.*)\)\s+\.\.\.\s*$"
)


def events(path, threads, named):
    """The traced calls in order of entry. A call another thread's line interrupted is
    printed twice (`... [continued]:` gives its duration and result); the two are joined."""
    out, open_calls = [], {}

    def add(pid, call, args, start, dur, ret):
        fd = FD.search(args)
        out.append(
            {
                "pid": pid,
                "call": call,
                "role": named.get((pid, int(fd[1]))) if fd else None,
                "fd": int(fd[1]) if fd else None,
                "start": start,
                "end": start + dur,
                "ret": ret,
            }
        )

    for line in open(path):
        m = LINE.match(line)
        if m:
            pid = threads.get(int(m["tid"]))
            if pid is not None:
                add(pid, m["call"], m["args"], float(m["ts"]), float(m["dur"]), int(m["ret"]))
            continue
        m = UNFINISHED.match(line)
        if m:
            open_calls[int(m["tid"])] = (m["call"], m["args"])
            continue
        m = CONTINUED.match(line)
        if m:
            tid = int(m["tid"])
            pid = threads.get(tid)
            call, args = open_calls.pop(tid, (m["call"], ""))
            if pid is not None:
                add(pid, call, args, float(m["ts"]), float(m["dur"]), int(m["ret"]))
    out.sort(key=lambda e: e["start"])
    return out


def turns(evs, brain, bench):
    """Per turn, ms charged to each part."""
    found = []
    sent = [
        e for e in evs
        if e["pid"] == bench and e["role"] == "client" and e["call"] in SENDS and e["ret"] > 0
    ]
    brain_evs = [e for e in evs if e["pid"] == brain]
    bench_reads = [
        e for e in evs
        if e["pid"] == bench and e["role"] == "client" and e["call"] in RECVS and e["ret"] > 0
    ]
    i = 0
    for n, post in enumerate(sent):
        limit = sent[n + 1]["start"] if n + 1 < len(sent) else float("inf")
        while i < len(brain_evs) and brain_evs[i]["start"] < post["start"]:
            i += 1
        window = []
        for e in brain_evs[i:]:
            if e["start"] >= limit:
                break
            window.append(e)
        request = next(
            (e for e in window if e["role"] == "client" and e["call"] in RECVS and e["ret"] > 0),
            None,
        )
        answer = next(
            (e for e in window if e["role"] == "provider" and e["call"] in RECVS and e["ret"] > 0),
            None,
        )
        if request is None or answer is None:
            continue
        delta = next(
            (
                e for e in window
                if e["role"] == "client" and e["call"] in SENDS and e["ret"] > 0
                and e["start"] >= answer["end"]
            ),
            None,
        )
        if delta is None:
            continue
        seen = next((e for e in bench_reads if e["start"] >= delta["start"]), None)
        if seen is None:
            continue
        parts = defaultdict(float)
        parts["client send -> brain has read the request"] = request["end"] - post["start"]
        parts["brain's write -> client has read it"] = seen["end"] - delta["end"]
        charge(window, request["end"], delta["end"], parts)
        parts["total"] = seen["end"] - post["start"]
        calls = defaultdict(int)
        for e in window:
            if request["end"] <= e["start"] <= delta["end"] and e["role"]:
                calls[f"{e['role']} {'send' if e['call'] in SENDS else 'recv'}"] += 1
            if request["end"] <= e["start"] <= delta["end"] and e["call"].startswith("epoll"):
                calls["epoll_wait"] += 1
        found.append((parts, calls))
    return found


def charge(window, start, stop, parts):
    """Charges [start, stop] to what the brain waits on at each instant: a peer's
    connection from the brain's send on it until the read that brings its answer, else
    the brain, named by the calls around it (`brain: redis answer -> pg send`). A 5-byte
    send to Postgres is a bare Sync: the pool's ping of a connection it takes back (sqlx
    pings every connection returned to its pool), told apart from the statements."""
    marks = []
    for e in window:
        if e["role"] in ("pg", "redis", "provider") and e["ret"] > 0 and start < e["end"] <= stop:
            if e["call"] in SENDS:
                ping = e["role"] == "pg" and e["ret"] == 5
                marks.append((e["end"], e["fd"], "pg ping" if ping else e["role"], +1))
            elif e["call"] in RECVS:
                marks.append((e["end"], e["fd"], e["role"], -1))
    marks.sort()
    waiting = {}
    at, last = start, "request read"
    for t, fd, role, step in marks + [(stop, None, "text-delta write", 0)]:
        if t > at:
            if waiting:
                parts["waiting on " + " + ".join(sorted(set(waiting.values())))] += t - at
            else:
                mark = role if step == 0 else f"{role} {'send' if step > 0 else 'answer'}"
                parts[f"brain: {last} -> {mark}"] += t - at
            at = t
        if step > 0:
            waiting[fd] = role
            last = f"{role} send"
        elif step < 0:
            last = f"{waiting.pop(fd, role)} answer"


def main():
    trace, socks, brain, bench = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    threads = {}
    for pid in (brain, bench):
        for line in open(f"{socks}.tasks.{pid}"):
            threads[int(line)] = pid
    named = roles(*sockets(socks, brain, bench), brain, bench)
    found = turns(events(trace, threads, named), brain, bench)
    if not found:
        sys.exit("no turn found in the trace")
    keys = sorted({k for parts, _ in found for k in parts}, key=lambda k: (k == "total", k))
    print(f"{len(found)} turns; ms per turn (a part a turn lacks counts as 0; parts whose "
          f"mean is under {SMALL} ms left out)")
    for k in keys:
        values = [parts.get(k, 0.0) for parts, _ in found]
        if statistics.mean(values) < SMALL:
            continue
        print(f"  {k:48s} p50 {statistics.median(values):7.3f}  mean {statistics.mean(values):7.3f}")
    names = sorted({k for _, calls in found for k in calls})
    print("system calls of the brain between the request and the first text-delta, median:")
    for k in names:
        print(f"  {k:48s} {statistics.median([c.get(k, 0) for _, c in found]):g}")


if __name__ == "__main__":
    main()
