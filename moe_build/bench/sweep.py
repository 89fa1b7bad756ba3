"""The token sweep: our layer at a dense set of token counts from 1 to 8192, against the floor.

Why: the GEMM tactic table (moe_build/planner/tactics/) switches at thresholds in rows per expert, and
a rule can hold at the benched counts (1, 16, 256, 4096) yet lose between them. The sweep times the default
plan (graph replay, the ceilings side by side at every count) at geometric steps plus both ends of every
tactic band of the plan, and optionally forced alternatives (`ours:STAGE=CHOICE`) at the same counts, so
that a rule's thresholds can be checked and derived from data. `outliers` names the counts that sit well
further from the floor than both neighbours.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from ..planner import make_plan
from ..target import Target
from .workload import bench_spec

SWEEP_MAX_TOKENS = 8192
GEOMETRIC_STEP = 1.25
OUTLIER_EXCESS = 0.10  # a count's ratio to the floor this much above both neighbours' is flagged


def geometric_counts(lo: int = 1, hi: int = SWEEP_MAX_TOKENS, step: float = GEOMETRIC_STEP) -> list[int]:
    """Token counts from lo to hi at least `step` apart (each count rounded, duplicates dropped)."""
    counts, x = {lo, hi}, float(lo)
    while x < hi:
        counts.add(min(hi, round(x)))
        x *= step
    return sorted(counts)


def band_edges(shape: str, target: Target, hi: int = SWEEP_MAX_TOKENS) -> list[int]:
    """Both ends of every token band of the default plan of `shape` on `target` up to `hi`: the counts
    where some rule switches (a tactic, the routing prologue, the finalize epilogue)."""
    return make_plan(bench_spec(shape), target, hi).band_edges(hi)


def sweep_counts(shape: str, target: Target, hi: int = SWEEP_MAX_TOKENS) -> list[int]:
    return sorted(set(geometric_counts(1, hi)) | set(band_edges(shape, target, hi)))


def device_sweep_target(hi: int = SWEEP_MAX_TOKENS) -> Target:
    """This GPU as the runner sees it, serving 1..hi tokens (what `band_edges` must plan for): the runner's
    own `device_target`, so the two cannot drift apart."""
    import torch

    from ..runner.runner import device_target
    return device_target(torch.device("cuda", 0), hi)


def outliers(points: Sequence[dict[str, Any]], variant: str = "ours",
             excess: float = OUTLIER_EXCESS) -> list[dict[str, Any]]:
    """Counts of one shape whose graph time over the floor exceeds both neighbours' by `excess` (relative)."""
    rows = [(p["tokens"], p["variants"].get(variant, {}).get("graph_us"), p["floor_us"]) for p in points]
    rows = [(t, us / fl) for t, us, fl in rows if us]
    found = []
    for (_, left), (t, mid), (_, right) in zip(rows, rows[1:], rows[2:]):
        if mid > (1 + excess) * max(left, right):
            found.append({"tokens": t, "over_floor": mid, "neighbours": (left, right)})
    return found


def best_alternatives(points: Sequence[dict[str, Any]], margin: float = 0.03) -> list[dict[str, Any]]:
    """Counts where a forced variant's graph time beats the default plan's by more than `margin`."""
    found = []
    for p in points:
        ours = p["variants"].get("ours", {}).get("graph_us")
        if not ours:
            continue
        alts = {v: e["graph_us"] for v, e in p["variants"].items() if v != "ours" and e.get("graph_us")}
        if alts:
            best = min(alts, key=alts.get)
            if alts[best] < (1 - margin) * ours:
                found.append({"shape": p["shape"], "tokens": p["tokens"], "ours_us": ours, "best": best,
                              "best_us": alts[best]})
    return found


def summary(results: dict[str, Any]) -> str:
    """The short text a device run prints last: per shape, the worst ratio to the floor and where, the
    outlier counts, and where a forced alternative won."""
    lines = []
    shapes = list(dict.fromkeys(p["shape"] for p in results["points"]))
    for shape in shapes:
        pts = [p for p in results["points"] if p["shape"] == shape]
        rated = [(p["tokens"], p["graph_over_floor"]) for p in pts if p.get("graph_over_floor")]
        if not rated:
            lines.append(f"{shape}: no timed points")
            continue
        worst = max(rated, key=lambda r: r[1])
        lines.append(f"{shape}: {len(rated)} counts, graph/floor {min(r[1] for r in rated):.2f}-{worst[1]:.2f} "
                     f"(worst at {worst[0]} tokens); outliers: "
                     + (", ".join(f"{o['tokens']} ({o['over_floor']:.2f})" for o in outliers(pts)) or "none"))
    for alt in best_alternatives(results["points"]):
        lines.append(f"  {alt['shape']} {alt['tokens']:>5}: {alt['best']} {alt['best_us']:.1f} us vs ours "
                     f"{alt['ours_us']:.1f}")
    return "\n".join(lines)


def plot(results: dict[str, Any], png: Path) -> None:
    """One panel per shape: graph-replayed time over the floor against tokens (log x), default and forced."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(p["shape"] for p in results["points"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        pts = [p for p in results["points"] if p["shape"] == shape]
        variants = list(dict.fromkeys(v for p in pts for v in p["variants"]))
        for v in variants:
            xy = [(p["tokens"], p["variants"][v]["graph_us"] / p["floor_us"]) for p in pts
                  if p["variants"].get(v, {}).get("graph_us")]
            if xy:
                ax.plot(*zip(*xy), "o-" if v == "ours" else ".-", lw=2 if v == "ours" else 0.8, ms=3,
                        label=v if v == "ours" else v.split(":", 1)[1][:40])
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        top = max((p["graph_over_floor"] for p in pts if p.get("graph_over_floor")), default=2.0)
        ax.set(xscale="log", ylim=(0.9, max(2.0, math.ceil(top * 2) / 2)), title=shape, xlabel="tokens",
               ylabel="time / floor (graph replay)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"token sweep, bf16 SwiGLU MoE layer, {results['device']}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
