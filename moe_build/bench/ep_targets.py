"""Issue 49's benchmark targets, read from a `moe-build bench-ep` result (moe_build/bench/ep.py's JSON), so each run
says itself which it met. Pure: no torch, no GPU.

- `one_all_to_all`: at 1 to 128 tokens per rank, the `nvlink` dispatch + combine (graph) costs at most one
  all-to-all: half the worst-case `all_to_all_single` pair replayed beside it;
- `link_ceiling`: at 4096 tokens per rank, the `nvlink` exchange's bandwidth is within 1.15x of the all-to-all link
  measured in the same run;
- `never_slower_nvlink` / `never_slower_nccl`: at every size, `nvlink` (graph) against the worst-case pair (graph),
  `nccl` (eager: the plan's form for a call that gives every rank's token count, as the pair's equal splits
  assume; bench ep.py times the exact form beside it) against the worst-case pair (eager);
- `overlap_hides_half`: at 1024+ tokens per GPU, dual-batch overlap takes off at least half of the layer's
  exchange time (the `nvlink` dispatch + combine of the same hidden size and tokens, graph).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ONE_ALL_TO_ALL_MAX_TOKENS = 128
LINK_TOKENS = 4096
LINK_RATIO = 1.15
OVERLAP_MIN_TOKENS = 1024
OVERLAP_HIDDEN_SHARE = 0.5
TARGETS = ("one_all_to_all", "link_ceiling", "never_slower_nvlink", "never_slower_nccl", "overlap_hides_half")


def _target(name: str, point: str, value: float, limit: float, met: bool) -> dict[str, Any]:
    return {"target": name, "point": point, "value": value, "limit": limit, "met": met}


def ep_targets(result: dict[str, Any], layer_hidden: Mapping[str, int]) -> list[dict[str, Any]]:
    """Every target at every point it applies to: {target, point, value, limit, met} (times in us);
    `layer_hidden`: each bench layer's hidden size (ep.py's LAYERS), to find its exchange time."""
    out: list[dict[str, Any]] = []
    link = result["link"]["gb_s"]
    exchange_us = {}
    for p in result["dispatch"]:
        at = f"hidden {p['hidden']}, {p['tokens']} tokens"
        ours, pair = 1e3 * p["nvlink_graph_ms"], 1e3 * p["worst_case_graph_ms"]
        exchange_us[(p["hidden"], p["tokens"])] = ours
        if p["tokens"] <= ONE_ALL_TO_ALL_MAX_TOKENS:
            out.append(_target("one_all_to_all", at, ours, pair / 2, ours <= pair / 2))
        if p["tokens"] == LINK_TOKENS:
            gbps = p["nvlink_graph_algbw_gb_s"]
            out.append(_target("link_ceiling", at, gbps, link / LINK_RATIO, gbps * LINK_RATIO >= link))
        out.append(_target("never_slower_nvlink", at, ours, pair, ours <= pair))
        nccl, worst = 1e3 * p["nccl_ms"], 1e3 * p["worst_case_ms"]
        out.append(_target("never_slower_nccl", at, nccl, worst, nccl <= worst))
    for p in result["layers"]:
        exchange = exchange_us.get((layer_hidden.get(p["layer"]), p["tokens_per_gpu"]))
        if p["tokens_per_gpu"] < OVERLAP_MIN_TOKENS or exchange is None:
            continue
        hidden = 1e3 * (p["ep_nvlink_graph_ms"] - p["ep_nvlink_overlap_graph_ms"])
        limit = OVERLAP_HIDDEN_SHARE * exchange
        out.append(_target("overlap_hides_half", f"{p['layer']}, {p['tokens_per_gpu']} tokens", hidden, limit,
                           hidden >= limit))
    return out


def summary(targets: list[dict[str, Any]]) -> str:
    """One line: met / total per target, then in all."""
    names = [n for n in TARGETS if any(t["target"] == n for t in targets)]
    parts = [f"{n} {sum(t['met'] for t in targets if t['target'] == n)} of "
             f"{sum(t['target'] == n for t in targets)}" for n in names]
    return f"targets (issue 49): {'; '.join(parts)}; met {sum(t['met'] for t in targets)} of {len(targets)}"
