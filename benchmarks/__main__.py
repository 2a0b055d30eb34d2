"""`python -m benchmarks [--quick] [--only SECTION ...] [--json FILE]`: run the CPU benchmarks, print ratios."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone

from benchmarks import cli, cluster, data_order, sweep, training
from benchmarks.harness import BenchError

SECTIONS = ("trainer", "accum", "workload", "cli", "startup", "data", "cluster", "sweep", "goodput")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one round and fewer steps: a smoke pass")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--pods",
        help="cluster section: job sizes to measure, e.g. 8,64 (default 8,64,512,1024; --quick 8,64)",
    )
    args = parser.parse_args(argv)
    sections = args.only or list(SECTIONS)
    quick = args.quick

    started = time.perf_counter()
    print(f"orch benchmarks, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}: "
          f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}"
          + (" (quick)" if quick else ""))  # fmt: skip
    results: dict[str, object] = {"quick": quick, "cpus": os.cpu_count()}
    try:
        if "trainer" in sections:
            results["trainer"] = training.overhead(rounds=1 if quick else 5, steps=40 if quick else 120)
        if "accum" in sections:
            steps = {1: 20, 4: 12, 16: 10} if quick else {1: 30, 4: 40, 16: 16}
            results["accum"] = training.accumulation(steps_by_accumulation=steps, rounds=1 if quick else 2)
        if "workload" in sections:
            results["workload"] = training.workload(rounds=1 if quick else 3, steps=24 if quick else 80)
        if "cli" in sections:
            results["cli"] = cli.latency(repeats=3 if quick else 15)
        if "startup" in sections:
            results["startup"] = training.startup(rounds=1 if quick else 3)
        if "cluster" in sections:
            sizes = cluster.QUICK_SIZES if quick else cluster.SIZES
            if args.pods:
                sizes = tuple(int(n) for n in args.pods.split(","))
            results["cluster"] = cluster.measure(sizes=sizes, rounds=1 if quick else 3)
        if "data" in sections:
            results["data"] = data_order.order_cost(steps=50 if quick else 200)
        if "sweep" in sections:
            results["sweep"] = sweep.overhead(trials=3 if quick else 6)
        if "goodput" in sections:
            results["goodput"] = training.goodput_overhead(
                rounds=1 if quick else 5, steps=40 if quick else 120
            )
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    results["seconds"] = time.perf_counter() - started
    print(f"\ndone in {results['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
