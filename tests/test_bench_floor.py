"""The bench's floor arithmetic (bench.layer.point_floor, bench.timing.CeilingCalls.rates, bench.layer.ratios) on the CPU.

What it must guarantee: a point's floor comes from the ceiling calls timed among its variants when
all three have a time (else from the run's burst ceilings, and says so), its byte rate is the higher of
the copy and read-only rates, the burst floor is always reported beside it, and the ratios divide by the
right floor. Expected values are worked out here from the definitions (copy: bytes read + written over
time; read: bytes over time; 2 m^3 FLOPs over time; the layer's weight bytes of the touched experts plus
activations in and out, and 2 T K (N1 H + H I) FLOPs).
"""
from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest

from moe_build.bench.layer import gather_points, point_floor, ratio, ratios
from moe_build.bench.timing import CEILING_TIMERS, CeilingCalls
from moe_build.bench.workload import bench_spec

COPY_KEY, READ_KEY, MATMUL_KEY = CEILING_TIMERS["copy"], CEILING_TIMERS["read"], CEILING_TIMERS["matmul"]


def layer_floor_us(shape: str, tokens: int, touched: float, bytes_per_s: float, flops_per_s: float) -> float:
    """The floor from the definition, independent of moe_build.bench.workload.floor_us."""
    H, I, K = {"qwen3-30b-a3b": (2048, 768, 8), "mixtral-8x7b": (4096, 14336, 2)}[shape]
    weight_bytes = touched * (2 * I * H + H * I) * 2  # gated: W1 is [2I, H], W2 [H, I], bf16
    act_bytes = 2 * tokens * H * 2
    flops = 2.0 * tokens * K * (2 * I * H + H * I)
    return max((weight_bytes + act_bytes) / bytes_per_s, flops / flops_per_s) * 1e6


@pytest.mark.parametrize("read_faster", [True, False])
def test_rates_from_call_times(read_faster: bool) -> None:
    copy_ms, mm_ms = random.uniform(0.3, 0.8), random.uniform(1.0, 2.0)
    read_ms = copy_ms / 2 * (0.9 if read_faster else 1.1)  # a read moves half a copy's bytes
    r = CeilingCalls.rates(copy_ms, read_ms, mm_ms)
    assert r["copy_bytes_per_s"] == pytest.approx(2 * 2 ** 30 / (copy_ms / 1e3))
    assert r["read_bytes_per_s"] == pytest.approx(2 ** 30 / (read_ms / 1e3))
    assert r["bytes_per_s"] == pytest.approx(r["read_bytes_per_s"] if read_faster else r["copy_bytes_per_s"])
    assert r["bf16_flops_per_s"] == pytest.approx(2 * 8192 ** 3 / (mm_ms / 1e3))


@pytest.mark.parametrize("shape,tokens", [("qwen3-30b-a3b", 4096), ("qwen3-30b-a3b", 1), ("mixtral-8x7b", 16)])
def test_point_floor_uses_side_by_side_ceilings(shape: str, tokens: int) -> None:
    spec = bench_spec(shape)
    touched = random.uniform(1, spec.num_experts)
    copy_ms, read_ms, mm_ms = random.uniform(0.3, 0.8), random.uniform(0.1, 0.5), random.uniform(1.0, 2.0)
    burst = {"bytes_per_s": random.uniform(3e12, 5e12), "bf16_flops_per_s": random.uniform(7e14, 9e14)}
    rec = point_floor(spec, tokens, touched, {COPY_KEY: copy_ms, READ_KEY: read_ms, MATMUL_KEY: mm_ms}, burst)
    bps = max(2 * 2 ** 30 / (copy_ms / 1e3), 2 ** 30 / (read_ms / 1e3))
    fps = 2 * 8192 ** 3 / (mm_ms / 1e3)
    assert rec["ceilings_source"] == "side_by_side"
    assert rec["floor_us"] == pytest.approx(layer_floor_us(shape, tokens, touched, bps, fps))
    assert rec["burst_floor_us"] == pytest.approx(
        layer_floor_us(shape, tokens, touched, burst["bytes_per_s"], burst["bf16_flops_per_s"]))


def test_point_floor_falls_back_to_burst() -> None:
    spec = bench_spec("qwen3-30b-a3b")
    burst = {"bytes_per_s": 4.2e12, "bf16_flops_per_s": 8.0e14}
    for medians in ({}, {COPY_KEY: 0.5}, {MATMUL_KEY: 1.4}, {COPY_KEY: 0.5, MATMUL_KEY: 1.4}):
        rec = point_floor(spec, 256, 100.0, medians, burst)
        assert rec["ceilings_source"] == "burst"
        assert rec["floor_us"] == pytest.approx(rec["burst_floor_us"])
        assert rec["floor_us"] == pytest.approx(layer_floor_us("qwen3-30b-a3b", 256, 100.0, 4.2e12, 8.0e14))


def test_ratios_divide_by_each_floor() -> None:
    rec = {"floor_us": 400.0, "burst_floor_us": 380.0,
           "variants": {"ours": {"us": 620.0, "graph_us": 600.0}, "grouped_mm": {"us": 1240.0}}}
    ratios(rec)
    assert rec["graph_over_floor"] == pytest.approx(1.5)
    assert rec["graph_over_burst_floor"] == pytest.approx(600.0 / 380.0)
    assert rec["ours_over_floor"] == pytest.approx(1.55)
    assert rec["speedup_vs"] == {"grouped_mm": pytest.approx(2.0)}


def test_gather_points_writes_what_was_measured_after_every_shape(tmp_path: Path) -> None:
    """Each shape's points join the results in turn and the JSON on disk holds them after every shape, so a bench
    cut off by a time-out keeps the shapes it finished (the second shape's call sees the first one's file)."""
    out = tmp_path / "bench.json"
    results: dict = {"device": "test", "points": []}
    seen_on_disk: list[int] = []

    def shape(name: str) -> list[dict]:
        seen_on_disk.append(len(json.loads(out.read_text())["points"]) if out.exists() else -1)
        return [{"shape": name, "tokens": t} for t in (1, 16)]

    gather_points(results, (functools.partial(shape, n) for n in ("a", "b")), out)
    assert seen_on_disk == [-1, 2]
    assert [(p["shape"], p["tokens"]) for p in json.loads(out.read_text())["points"]] == [
        ("a", 1), ("a", 16), ("b", 1), ("b", 16)]
    assert results["points"] == json.loads(out.read_text())["points"]
    gather_points(results, [lambda: [{"shape": "c"}]], None)
    assert results["points"][-1] == {"shape": "c"} and len(json.loads(out.read_text())["points"]) == 4


def test_ratio_is_none_where_a_side_was_not_measured() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(3.0, None) is None and ratio(3.0, 0.0) is None
