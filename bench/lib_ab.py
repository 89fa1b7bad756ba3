"""Kernel libraries side by side on whole layers: `moe-build bench` run once per library and round, the libraries
alternated (round 1: A, B, ...; round 2: the same order), each run its own process (a process loads one library),
then one line per point and variant with every run's graph-replay time and each library's total over the rounds
against the first library's. The method behind the library comparisons in docs/performance.md, written once.

    python bench/lib_ab.py --libs main=/tmp/main/libmoe_build_kernels.so,new=/tmp/new/libmoe_build_kernels.so \\
        --rounds 2 --out $OUT/ab -- --quant fp8 --shapes qwen3-30b-a3b --tokens 1,16 --variants ours --iters 10

A library whose Python differs too (a new kernel argument, a weight form the runner makes) names its source tree:
NAME=PATH@TREE runs that library's bench from TREE (its `moe_build` then imported from there).

Everything after `--` goes to `moe-build bench` as it is (its `--json` is set here: OUT/NAME_ROUND.json); the table
goes to stdout and OUT/summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

Key = tuple[str, str, int, str]  # quant ("bf16" for the 16-bit bench), shape, tokens, variant


def graph_times(bench_json: dict) -> dict[Key, float]:
    """Graph-replay microseconds of every (point, variant) of one `moe-build bench --json` file."""
    out: dict[Key, float] = {}
    for p in bench_json["points"]:
        for variant, v in p["variants"].items():
            if v.get("graph_us") is not None:
                out[(p.get("quant", "bf16"), p["shape"], int(p["tokens"]), variant)] = float(v["graph_us"])
    return out


def compare(runs: dict[str, list[dict[Key, float]]]) -> list[dict]:
    """Per (point, variant) of the first library's first run: each library's times by round and its total over the
    rounds divided by the first library's (None where a run lacks the point)."""
    names = list(runs)
    rows = []
    for key in sorted(runs[names[0]][0]):
        times = {n: [r.get(key) for r in runs[n]] for n in names}
        base = times[names[0]]
        ratios = {}
        for n in names[1:]:
            t = times[n]
            whole = None not in t and None not in base
            ratios[n] = sum(t) / sum(base) if whole else None
        rows.append({"quant": key[0], "shape": key[1], "tokens": key[2], "variant": key[3], "us": times,
                     "over_first": ratios})
    return rows


def table(rows: list[dict]) -> str:
    """The comparison as fixed-width text, one line per point and variant."""
    lines = []
    for r in rows:
        cells = "  ".join(f"{n} " + " ".join("-" if t is None else f"{t:.1f}" for t in ts) for n, ts in r["us"].items())
        ratios = "  ".join(f"{n}/{next(iter(r['us']))} " + ("-" if x is None else f"{x:.3f}")
                           for n, x in r["over_first"].items())
        lines.append(f"{r['quant']:10} {r['shape']:17} {r['tokens']:5}  {r['variant'][:40]:40}  {cells}  {ratios}")
    return "\n".join(lines)


def parse_libs(text: str) -> dict[str, tuple[str, str | None]]:
    """NAME=PATH[@TREE],... -> {NAME: (PATH, TREE or None)}, in order; each path must exist, and each tree hold a
    moe_build package."""
    libs = {}
    for item in text.split(","):
        name, sep, rest = item.partition("=")
        path, at, tree = rest.partition("@")
        if not sep or not name or not path or (at and not tree):
            raise SystemExit(f"lib_ab: --libs: {item!r} is not NAME=PATH or NAME=PATH@TREE")
        if not Path(path).is_file():
            raise SystemExit(f"lib_ab: --libs: {path} is not a file")
        if tree and not (Path(tree) / "moe_build" / "__init__.py").is_file():
            raise SystemExit(f"lib_ab: --libs: {tree} holds no moe_build package")
        libs[name] = (path, tree or None)
    if len(libs) < 2:
        raise SystemExit("lib_ab: --libs: name two libraries or more")
    return libs


def main() -> None:
    argv = sys.argv[1:]
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libs", required=True,
                    help="NAME=PATH[@TREE][,NAME=PATH[@TREE]...]: the first is the baseline")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per bench run")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if "--json" in bench_args:
        raise SystemExit("lib_ab: leave --json out of the bench arguments: it is set per run")
    libs = parse_libs(args.libs)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[Key, float]]] = {n: [] for n in libs}
    for r in range(1, args.rounds + 1):
        for name, (path, tree) in libs.items():
            dest = (args.out / f"{name}_{r}.json").resolve()
            cmd = [sys.executable, "-m", "moe_build", "bench", *bench_args, "--json", str(dest)]
            env = {**os.environ, "MOE_BUILD_KERNELS_LIB": str(Path(path).resolve())}  # the same file from any tree
            print(f"round {r}, {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, env=env, cwd=tree, timeout=args.timeout, capture_output=True, text=True)
            (args.out / f"{name}_{r}.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                raise SystemExit(f"lib_ab: the bench with {name} failed (rc {done.returncode}): "
                                 f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}")
            runs[name].append(graph_times(json.loads(dest.read_text())))
    rows = compare(runs)
    (args.out / "summary.json").write_text(json.dumps({"libs": libs, "rounds": args.rounds, "bench": bench_args,
                                                       "rows": rows}, indent=1))
    print(table(rows))
    ratios = [x for r in rows for x in r["over_first"].values() if x is not None]
    if ratios:
        print(f"over the first library: {min(ratios):.3f} .. {max(ratios):.3f}")


if __name__ == "__main__":
    main()
