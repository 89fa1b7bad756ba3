"""Two sets of bench results side by side: before and after a change, per shape and token count.

`python -m moe_build.bench.compare OLD.json [OLD.json ...] -- NEW.json [NEW.json ...]` prints, for every
point both sides timed, the graph-replayed time of "ours" on each side (the range over the given runs,
which were alternated process by process so that neither side owns a warm or cool GPU) and new over old
(medians of the runs). A point more than 2% slower is marked.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

SLOWER_MARK = 1.02


def graph_times(paths: Sequence[str | Path], variant: str = "ours") -> dict[tuple[str, int], list[float]]:
    """(shape, tokens) -> the variant's graph_us in each results file that timed it."""
    times: dict[tuple[str, int], list[float]] = {}
    for path in paths:
        for p in json.loads(Path(path).read_text())["points"]:
            us = p["variants"].get(variant, {}).get("graph_us")
            if us:
                times.setdefault((p["shape"], int(p["tokens"])), []).append(float(us))
    return times


def compare(old: dict[tuple[str, int], list[float]], new: dict[tuple[str, int], list[float]]) -> list[dict[str, Any]]:
    rows = []
    for key in sorted(set(old) & set(new)):
        ratio = statistics.median(new[key]) / statistics.median(old[key])
        rows.append({"shape": key[0], "tokens": key[1], "old_us": old[key], "new_us": new[key], "new_over_old": ratio})
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    def span(v: list[float]) -> str:
        return f"{min(v):.1f}-{max(v):.1f}" if len(v) > 1 else f"{v[0]:.1f}"
    lines = [f"{'shape':<17}{'T':>6}{'old us':>16}{'new us':>16}{'new/old':>9}"]
    for r in rows:
        mark = "  slower" if r["new_over_old"] > SLOWER_MARK else ""
        lines.append(f"{r['shape']:<17}{r['tokens']:>6}{span(r['old_us']):>16}{span(r['new_us']):>16}"
                     f"{r['new_over_old']:>9.3f}{mark}")
    if rows:
        worst = max(rows, key=lambda r: r["new_over_old"])
        lines.append(f"worst: {worst['shape']} {worst['tokens']} tokens, new/old {worst['new_over_old']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if "--" not in argv:
        print("usage: python -m moe_build.bench.compare OLD.json ... -- NEW.json ...", file=sys.stderr)
        return 2
    cut = list(argv).index("--")
    print(table(compare(graph_times(argv[:cut]), graph_times(argv[cut + 1:]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
