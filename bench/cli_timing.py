"""Wall time of `moe-build fusion-report` and of a full `--sweep`, as whole processes.

Median of N runs after one warm-up, Python start-up included (that is what a user waits for).
Usage: python bench/cli_timing.py [-n 10]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "fusion-report (mixtral-8x7b, sm90)": ["fusion-report", "--preset", "mixtral-8x7b", "--sm", "90",
                                           "--flavour", "tensorrt"],
    "fusion-report --json (tiny)": ["fusion-report", "--json"],
    "fusion-report --sweep (8 SMs x 3 dtypes x 8 quants)": ["fusion-report", "--preset", "mixtral-8x7b",
                                                            "--flavour", "tensorrt", "--sweep"],
}


def time_command(args: list[str], runs: int) -> list[float]:
    cmd = [sys.executable, "-m", "moe_build", *args]
    subprocess.run(cmd, check=True, capture_output=True)  # warm-up: page cache, .pyc files
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=10, help="timed runs per case")
    n = parser.parse_args().n
    print(f"{'case':55s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for name, args in CASES.items():
        s = time_command(args, n)
        print(f"{name:55s} {statistics.median(s):9.3f} {min(s):7.3f} {max(s):7.3f}")


if __name__ == "__main__":
    main()
