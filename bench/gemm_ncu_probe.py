"""What bounds a prefill grouped GEMM: Nsight Compute's throughput counters for each of the layer's
GEMMs, next to one cuBLAS matmul of the same rows.

Why: timings say how far a GEMM is from the floor but not which unit holds it there. Under ncu
(caches flushed before every kernel, clocks left alone as METHOD.md asks) each GEMM runs once:
GEMM1 through the gated (swiglu) epilogue the layer runs and GEMM2 through the plain store, on
random top-k routing, at each --tiles choice (MB_SM90_WGMMA_TILE; "auto" = the library's rule), and
`mm`: torch.mm of all the rows against one expert's weights (cuBLAS; the same FLOPs without the
expert weight traffic or the ragged segments). Per kernel it reports the duration, the SM (tensor
pipe), L2 and DRAM throughput as % of peak, the L2 and DRAM bytes and the L2 hit rate. Each duration is
one cold run of a kernel that had the GPU to itself: it says where a kernel's time goes, not which tile
is faster in a layer (on the H200 it put Mixtral's single-CTA tile 6% ahead of the auto tile that the
interleaved bench/gemm_rate_probe.py, the tile rule's judge, puts 2% behind).

Usage (on the GPU machine, ncu on PATH):
  PYTHONPATH=. python bench/gemm_ncu_probe.py [--tokens 4096] [--shapes qwen3-30b-a3b,deepseek-v2-lite]
      [--tiles auto,pingpong64x256] [--json PATH]
Prints a table and writes --json (default $OUT/gemm_ncu_probe.json) plus ncu's raw CSV beside it.
`--child` is the process ncu profiles; `--summarize CSV LABELS` re-reads a saved run.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# name in ncu's CSV -> column of the table
METRICS = {
    "gpu__time_duration.sum": "us",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM%",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2%",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM%",
    "lts__t_bytes.sum": "L2 GB",
    "dram__bytes_read.sum": "DRAM rd GB",
    "lts__t_sector_hit_rate.pct": "L2 hit%",
}
RANGE = "gemm_ncu"  # the NVTX range ncu is told to profile
# ncu's units -> the table's (us for times, bytes before the GB columns divide)
UNIT_SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "byte": 1.0, "Kbyte": 1e3,
              "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "%": 1.0}


def child(args: argparse.Namespace) -> None:
    """Run each GEMM once inside the NVTX range; write the labels, in launch order, to args.labels."""
    import torch

    from bench.gemm_bench import gemm_lib, gemm_problems, run_sm90_tile

    g = gemm_lib.Gemms(gemm_lib.load())
    gen = torch.Generator(device="cuda").manual_seed(0)
    labels = []
    for name, gemm, n, k, rows, w, a, routed, _ in gemm_problems(args.shapes, args.tokens, gen):
        c = torch.empty(rows, n, device="cuda", dtype=a.dtype)
        gated = gemm == "g1"
        out = torch.empty(rows, n // 2, device="cuda", dtype=a.dtype) if gated else c
        variants = {tile: (lambda tile=tile: run_sm90_tile(g, tile, a, w, out, routed, rows, n, k, gated))
                    for tile in args.tiles.split(",")}
        variants["mm"] = lambda: torch.mm(a, w[0].t(), out=c)
        for variant, fn in variants.items():
            fn()  # warm-up outside the range: first-call setup is not what is measured
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(RANGE)
            fn()
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            labels.append({"shape": name, "gemm": gemm, "variant": variant, "rows": rows, "n": n, "k": k})
    Path(args.labels).write_text(json.dumps(labels))


def summarize(csv_text: str, labels: list[dict]) -> list[dict]:
    """Pair ncu's kernels, in launch order, with the labels: every GEMM call is one kernel launch."""
    lines = csv_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        k = kernels.setdefault(row["ID"], {"kernel": row["Kernel Name"][:60]})
        if row["Metric Name"] in METRICS:
            value = float(row["Metric Value"].replace(",", "")) * UNIT_SCALE[row["Metric Unit"]]
            k[METRICS[row["Metric Name"]]] = value
    found = list(kernels.values())  # ncu lists kernels in launch order
    if len(found) != len(labels):
        raise SystemExit(f"gemm_ncu_probe: {len(found)} profiled kernels for {len(labels)} GEMM calls")
    out = []
    for label, k in zip(labels, found):
        k["L2 GB"] /= 1e9
        k["DRAM rd GB"] /= 1e9
        out.append({**label, **k})
    return out


def table(results: list[dict]) -> str:
    cols = list(METRICS.values())
    head = f"{'shape':17s} {'gemm':4s} {'variant':18s}" + "".join(f"{c:>11s}" for c in cols)
    rows = [f"{r['shape']:17s} {r['gemm']:4s} {r['variant']:18s}" + "".join(f"{r[c]:11.2f}" for c in cols)
            for r in results]
    return "\n".join([head, *rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b")
    ap.add_argument("--tiles", default="auto")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gemm_ncu_probe.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--labels", help=argparse.SUPPRESS)
    ap.add_argument("--summarize", nargs=2, metavar=("CSV", "LABELS"), help="re-read a saved run")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.summarize:
        results = summarize(Path(args.summarize[0]).read_text(), json.loads(Path(args.summarize[1]).read_text()))
        print(table(results))
        return
    ncu = shutil.which("ncu")
    if ncu is None:
        raise SystemExit("gemm_ncu_probe: ncu (Nsight Compute) is not on PATH")
    stem = Path(args.json).with_suffix("")
    labels_path, csv_path = f"{stem}.labels.json", f"{stem}.ncu.csv"
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{RANGE}/",
           "--metrics", ",".join(METRICS), "--csv", "--page", "details", "--print-units", "base",
           sys.executable, __file__, "--child", "--labels", labels_path, "--tokens", str(args.tokens),
           "--shapes", args.shapes, "--tiles", args.tiles]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    Path(csv_path).write_text(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"gemm_ncu_probe: ncu exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    results = summarize(proc.stdout, json.loads(Path(labels_path).read_text()))
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
