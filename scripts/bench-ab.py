#!/usr/bin/env python3
"""Two builds of the gateway benchmark against each other, in alternating runs on one machine
(README: "Against a baseline, in wall time"). One run on a shared machine swings by a tenth or
more, so one run of each cannot tell a change of a few percent from noise; pairs run back to
back can, and this reports the ratio per pair with its standard error.

  bench-ab.py BASELINE_BENCH NEW_BENCH [--pairs 12] [--seconds 6] [--connections 50]
              [--engine host:port]

Each *_BENCH is a built `gateway` bench binary (target/release/deps/gateway-*). The engine is
one `tokenfactory engine-sim --models bench-base,bench-embed` process both runs share
(default 127.0.0.1:18100, started beforehand), so the CPU each run reports is its gateway's and
its load generator's. Needs PostgreSQL, as the bench does. Runs `TF_BENCH_ONLY=gateway`:
non-streamed chat through the gateway only.
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"gateway: ([\d.]+) req/s, ([\d.]+) us CPU per request")


def run(binary, args):
    env = dict(
        os.environ,
        TF_BENCH_SIM=args.engine,
        TF_ALLOW_OWNER_ROLE="true",
        TF_BENCH_ONLY="gateway",
        TF_BENCH_SECONDS=str(args.seconds),
        TF_BENCH_CONNECTIONS=str(args.connections),
    )
    out = subprocess.run(
        [binary, "--bench"], env=env, capture_output=True, text=True, check=False
    ).stdout
    m = LINE.search(out)
    if not m:
        sys.exit(f"{binary}: no 'gateway: N req/s' line (does it read TF_BENCH_SIM?)")
    return float(m.group(1)), float(m.group(2))


def spread(xs):
    """Standard deviation over mean: how far one binary's runs swing."""
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def summary(name, base, new):
    ratios = [n / b for b, n in zip(base, new)]
    mean = statistics.mean(ratios)
    se = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else float("nan")
    print(
        f"{name}: new/baseline per pair mean {mean:.3f} (standard error {se:.3f}), "
        f"median {statistics.median(ratios):.3f}; run-to-run spread baseline "
        f"{spread(base):.1%}, new {spread(new):.1%}"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("baseline")
    p.add_argument("new")
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--seconds", type=int, default=6)
    p.add_argument("--connections", type=int, default=50)
    p.add_argument("--engine", default="127.0.0.1:18100")
    args = p.parse_args()
    base, new = [], []
    for i in range(args.pairs):
        # The order flips every pair, so a drift on the machine weighs on both alike.
        if i % 2 == 0:
            bl = run(args.baseline, args)
            nw = run(args.new, args)
        else:
            nw = run(args.new, args)
            bl = run(args.baseline, args)
        base.append(bl)
        new.append(nw)
        print(
            f"pair {i + 1}: baseline {bl[0]:.0f} req/s {bl[1]:.1f} us CPU/req; "
            f"new {nw[0]:.0f} req/s {nw[1]:.1f} us CPU/req",
            flush=True,
        )
    summary("throughput", [b[0] for b in base], [n[0] for n in new])
    summary("CPU per request", [b[1] for b in base], [n[1] for n in new])


if __name__ == "__main__":
    main()
