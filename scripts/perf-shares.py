#!/usr/bin/env python3
"""Shares of a `perf record --call-graph dwarf` profile, read from
`perf script -F comm,tid,ip,sym` on stdin (README: "Where the gateway's CPU goes").

  perf-shares.py incl PATTERN...     share of samples with a frame matching each pattern
  perf-shares.py inner FRAME [OWN]   samples under FRAME, by their innermost frame matching OWN
                                     (default: this workspace's crates)
  perf-shares.py callers LEAF [N]    samples whose leaf matches LEAF, by their N callers
"""
import collections
import re
import sys


def samples(lines):
    """Each sample's frames, leaf first."""
    out, cur = [], []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip() or not line.startswith((" ", "\t")):
            if cur:
                out.append(cur)
            cur = []
            continue
        parts = line.strip().split(None, 1)
        cur.append(parts[1] if len(parts) > 1 else "?")
    if cur:
        out.append(cur)
    return out


def show(counter, n, limit=30):
    for key, count in counter.most_common(limit):
        print(f"{100 * count / n:6.2f}%  {key[:150]}")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("incl", "inner", "callers"):
        sys.exit(__doc__)
    mode, args = sys.argv[1], sys.argv[2:]
    all_samples = samples(sys.stdin)
    n = max(len(all_samples), 1)
    print(f"{len(all_samples)} samples")
    if mode == "incl":
        for pattern in args:
            p = re.compile(pattern)
            hit = sum(1 for s in all_samples if any(p.search(f) for f in s))
            print(f"{100 * hit / n:6.2f}%  {pattern}")
    elif mode == "inner":
        frame = re.compile(args[0])
        own = re.compile(args[1] if len(args) > 1 else r"tokenfactory::|tf_")
        by = collections.Counter()
        for s in all_samples:
            if any(frame.search(f) for f in s):
                inner = next((f for f in s if own.search(f)), "<none>")
                by[re.sub(r"<[^<>]*>", "<>", inner)] += 1
        print(f"{100 * sum(by.values()) / n:.2f}% under {args[0]}")
        show(by, n)
    else:
        leaf = re.compile(args[0])
        depth = int(args[1]) if len(args) > 1 else 1
        by = collections.Counter()
        for s in all_samples:
            if s and leaf.search(s[0]):
                by[" <- ".join(f[:90] for f in s[1 : 1 + depth])] += 1
        print(f"{100 * sum(by.values()) / n:.2f}% with leaf {args[0]}")
        show(by, n)


if __name__ == "__main__":
    main()
