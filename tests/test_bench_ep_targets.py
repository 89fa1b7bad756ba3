"""Issue 49's bench targets read from a real `moe-build bench-ep` result (4 x H200, committed under docs/measured):
the verdicts below were read off that file's numbers by hand, not by the code under test."""
from __future__ import annotations

import json
from pathlib import Path

from moe_build.bench.ep import LAYER_HIDDEN
from moe_build.bench.ep_targets import ep_targets, summary

RESULT = Path(__file__).parent.parent / "docs/measured/h200x4-2026-11-28-ep-in-place/bench_ep.json"


def _by_target() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in ep_targets(json.loads(RESULT.read_text()), LAYER_HIDDEN):
        out.setdefault(t["target"], []).append(t)
    return out


def test_each_target_applies_where_the_issue_says() -> None:
    got = {name: [t["point"] for t in ts] for name, ts in _by_target().items()}
    assert got["one_all_to_all"] == [f"hidden {h}, {n} tokens" for h in (2048, 7168) for n in (1, 16, 128)]
    assert got["link_ceiling"] == ["hidden 2048, 4096 tokens", "hidden 7168, 4096 tokens"]
    assert len(got["never_slower_nvlink"]) == len(got["never_slower_nccl"]) == 12
    assert got["overlap_hides_half"] == ["qwen3-30b-a3b, 4096 tokens", "deepseek-v3-shaped, 4096 tokens"]


def test_verdicts_of_the_measured_run() -> None:
    t = _by_target()
    # nvlink 27.7 us against half of 33.0 (hidden 2048, 1 token) ... 65.6 against half of 79.4 (7168, 128): all missed
    assert [x["met"] for x in t["one_all_to_all"]] == [False] * 6
    # 269.4 and 311.8 GB/s against the 297.8 GB/s link / 1.15 = 258.9: both met
    assert [x["met"] for x in t["link_ceiling"]] == [True, True]
    assert abs(t["link_ceiling"][0]["limit"] - 297.78 / 1.15) < 0.01
    # nvlink graph below the worst-case pair everywhere (27.7 < 33.0 ... 1022.9 < 1240.1); nccl eager above it
    assert all(x["met"] for x in t["never_slower_nvlink"])
    assert not any(x["met"] for x in t["never_slower_nccl"])
    # overlap is slower: 1049.8 - 1081.8 us (Qwen3) and 6665.2 - 6719.5 (DeepSeek-V3-shaped) at 4096 tokens
    assert [round(x["value"], 1) for x in t["overlap_hides_half"]] == [-32.0, -54.3]
    limits = [x["limit"] for x in t["overlap_hides_half"]]  # half of 338.5 and 1022.9 us
    assert abs(limits[0] - 169.25) < 0.1 and abs(limits[1] - 511.45) < 0.1
    assert not any(x["met"] for x in t["overlap_hides_half"])


def test_summary_counts() -> None:
    line = summary(ep_targets(json.loads(RESULT.read_text()), LAYER_HIDDEN))
    assert line == ("targets (issue 49): one_all_to_all 0 of 6; link_ceiling 2 of 2; never_slower_nvlink 12 of 12; "
                    "never_slower_nccl 0 of 12; overlap_hides_half 0 of 2; met 14 of 34")


def test_the_table_of_a_run_with_the_nccl_forms() -> None:
    """bench-ep's closing table over a 2 x H200 run that timed both nccl forms (its first row's times as the run's log
    printed them while timing): every dispatch row shows the all-gather form, the two phases and the pair, eager and
    graph."""
    from moe_build.bench.ep import table
    run = Path(__file__).parent.parent / "docs/measured/h200x2-2026-11-30-nccl-all-gather/bench_ep_run1.json"
    lines = table(json.loads(run.read_text())).splitlines()
    assert lines[2].split()[:11] == ["2048", "1", "|", "343.4", "170.4", "429.6", "80.5", "|", "19.7", "24.1", "19.6"]
    assert sum(line.startswith("  qwen3-30b-a3b") for line in lines) == 4
    assert lines[-1].startswith("targets (issue 49): one_all_to_all 0 of 6;")
