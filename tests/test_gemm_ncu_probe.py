"""bench/gemm_ncu_probe.py's reading of Nsight Compute's CSV (no GPU needed)."""
from __future__ import annotations

import csv
import io

import pytest

from bench.gemm_ncu_probe import METRICS, summarize

HEADER = ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
# one metric per kernel row: (name in ncu, unit, value as ncu prints it)
VALUES = [("gpu__time_duration.sum", "ns", "371,168"), ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "70.19"),
          ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "%", "79.23"),
          ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "55.51"),
          ("lts__t_bytes.sum", "Mbyte", "2,857.91"), ("dram__bytes_read.sum", "byte", "941,391,616"),
          ("lts__t_sector_hit_rate.pct", "%", "48.75")]


def _csv(kernels: list[tuple[str, str]]) -> str:
    out = io.StringIO()
    out.write("==PROF== Connected to process 1\nsome program output\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(HEADER)
    for kid, name in kernels:
        for metric, unit, value in VALUES:
            w.writerow([kid, name, "Command line profiler metrics", metric, unit, value])
    return out.getvalue()


LABEL = {"shape": "qwen3-30b-a3b", "gemm": "g1", "variant": "auto", "rows": 32768, "n": 1536, "k": 2048}


def test_pairs_kernels_with_labels_and_scales_units() -> None:
    text = _csv([("1", "cutlass::device_kernel<GemmUniversal>"), ("2", "nvjet_sm90_tst_256x128")])
    got = summarize(text, [LABEL, {**LABEL, "variant": "mm"}])
    assert [r["variant"] for r in got] == ["auto", "mm"]
    assert got[0]["kernel"].startswith("cutlass::device_kernel") and got[1]["kernel"].startswith("nvjet")
    first = got[0]
    assert first["us"] == pytest.approx(371.168)
    assert first["L2 GB"] == pytest.approx(2.85791)
    assert first["DRAM rd GB"] == pytest.approx(0.941391616)
    assert (first["SM%"], first["L2%"], first["DRAM%"], first["L2 hit%"]) == (70.19, 79.23, 55.51, 48.75)
    assert set(METRICS.values()) <= set(first)


def test_a_kernel_count_that_does_not_match_the_calls_is_an_error() -> None:
    text = _csv([("1", "cutlass::device_kernel<GemmUniversal>")])
    with pytest.raises(SystemExit, match="1 profiled kernels for 2 GEMM calls"):
        summarize(text, [LABEL, LABEL])
