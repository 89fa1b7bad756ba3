"""The FP8 grouped GEMM (mb_grouped_gemm_fp8) under every tactic, on the bench shapes' two GEMMs at 1, 16, 256
and 4096 tokens, both scalings, L2 flushed before each call, median of 20: the evidence for the FP8 rules in
moe_build/planner/tactics/fp8.py. The wgmma kernel runs every FP8 tile of the scaling (FP8_WGMMA_TILES, the 2x1-
cluster and 128x192 tiles included) from 16 tokens on. Writes fp8_gemm_probe.json to $OUT (or the working
directory): the read rate measured here and per row the stored bytes of the touched experts (e4m3 weights and their
scales). Ends with two tables: the decode table (gemm_probe_timing.decode_table: achieved read rate of the decode
tactics at 1 and 16 tokens), and per GEMM each wgmma tile's PFLOP/s (2 * rows * n * k per call) next to
torch._scaled_mm's (rowwise scales, fp32 accumulation: use_fast_accum=False) on one expert's average rows, the
ceiling the tiles are measured against.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/fp8_tactics_probe.py
    MB_PROBE_OLD_LIB=.../old/libmoe_build_kernels.so ...   # also runs it on an older library, side by side
"""
import json, os, torch
from gemm_probe_timing import decode_table, read_rate, run_old, tms
from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Scaling
from moe_build.kernels.ops import fp8_scale_shapes
from moe_build.planner.tactics.tactic import FP8_WGMMA_TILES


def pflops(rows: int, n: int, k: int, us: float) -> float:
    return 2.0 * rows * n * k / (us * 1e-6) / 1e15


def scaled_mm_us(m: int, n: int, k: int) -> float | None:
    """torch._scaled_mm on one [m, k] x [k, n] GEMM with rowwise scales and fp32 accumulation, bf16 out; None
    where this torch refuses the shape."""
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(m, 1, device="cuda"), torch.rand(1, n, device="cuda")
    try:
        return tms(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                            use_fast_accum=False))
    except RuntimeError as e:
        print("torch._scaled_mm", m, n, k, "refused:", e, flush=True)
        return None


gemms = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "mixtral_g1": (8, 2, 28672, 4096),
         "mixtral_g2": (8, 2, 4096, 14336), "dsv2_g1": (64, 6, 2816, 2048)}
read_bps = read_rate()
rows = []
for name, (E, topk, n, k) in gemms.items():
    b = torch.randn(E, n, k, device="cuda").to(torch.float8_e4m3fn)
    for tokens in (1, 16, 256, 4096):
        R = tokens * topk
        ids = torch.randint(0, E, (R,), device="cuda")
        counts = torch.bincount(ids, minlength=E)
        off = torch.zeros(E + 1, dtype=torch.int64, device="cuda"); off[1:] = counts.cumsum(0)
        touched = int((counts > 0).sum())
        a = torch.randn(R, k, device="cuda").to(torch.float8_e4m3fn)
        c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(E, R, n, k) + 1, dtype=torch.uint8, device="cuda")
        for sc in (Fp8Scaling.ROWWISE, Fp8Scaling.BLOCK128):
            sa_s, sb_s = fp8_scale_shapes(sc, R, E, n, k)
            sa, sb = torch.rand(sa_s, device="cuda"), torch.rand(sb_s, device="cuda")
            tacs = ([f"decode:ksplit{s}:after_trigger:plain" for s in (1, 2, 4, 8)] if tokens <= 16 else []) + \
                   ([f"wgmma:{t}:plain:plain" for t in FP8_WGMMA_TILES[sc.name.lower()]] if tokens >= 16 else [])
            res = {}
            for t in tacs:
                try:
                    res[t] = round(tms(lambda: K.grouped_gemm_fp8(a, sa, b, sb, off, sc, c=c, workspace=ws, tactic=t)),
                                   1)
                except K.KernelError as e:  # a refusal is reported and the probe goes on; a fault would not return
                    print(name, tokens, sc.name, t, "refused:", e, flush=True)
            best = min(res, key=res.get)
            print(name, tokens, sc.name, res, "best", best, flush=True)
            stored = touched * (n * k + sb[0].numel() * sb.element_size())
            rows.append(dict(gemm=name, tokens=tokens, scaling=sc.name, rows=R, n=n, k=k, bytes=stored, times=res))
        if tokens >= 16:
            m = -(-R // E)
            us = scaled_mm_us(m, n, k)
            rows.append(dict(gemm=name, tokens=tokens, scaling="SCALED_MM", rows=m, n=n, k=k,
                             times={"torch._scaled_mm": us if us is None else round(us, 1)}))
json.dump(dict(read_bytes_per_s=read_bps, rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8_gemm_probe.json"), "w"), indent=1)
decode_table(rows, "scaling", run_old(__file__, "fp8_gemm_probe.json"), read_bps)

# PFLOP/s per wgmma tile (columns) by token count and scaling (rows), one table per GEMM; scaled_mm: one
# expert's average rows as a dense GEMM.
tiles = list(dict.fromkeys(t for s in FP8_WGMMA_TILES.values() for t in s))
for name in gemms:
    print(f"\n{name}: PFLOP/s  (scaled_mm = torch._scaled_mm, rowwise, one expert's average rows)")
    print(f"{'tokens':>6} {'scaling':9} " + " ".join(f"{t:>14}" for t in tiles) + f" {'scaled_mm':>10}")
    for r in rows:
        if r["gemm"] != name or r["tokens"] < 16 or r["scaling"] == "SCALED_MM":
            continue
        ref = next(x for x in rows if x["gemm"] == name and x["tokens"] == r["tokens"] and x["scaling"] == "SCALED_MM")
        cells = []
        for t in tiles:
            us = r["times"].get(f"wgmma:{t}:plain:plain")
            cells.append(f"{pflops(r['rows'], r['n'], r['k'], us):14.3f}" if us else f"{'-':>14}")
        mm_us = ref["times"]["torch._scaled_mm"]
        mm = f"{pflops(ref['rows'], ref['n'], ref['k'], mm_us):10.3f}" if mm_us else f"{'-':>10}"
        print(f"{r['tokens']:6} {r['scaling'].lower():9} " + " ".join(cells) + f" {mm}")
