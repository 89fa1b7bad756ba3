"""What the GEMM tactic probes share (bench/fp8_tactics_probe.py, bench/woq_tactics_probe.py): one call's GPU time
with L2 flushed before it, the read rate measured in the same process, the decode table, the side-by-side run
of an older library, and random operands (rowwise FP8, the mixed-input weight-only GEMM's weights).

The flush reads 256 MB (a sum) instead of writing it: a written flush leaves L2 (50 MB on an H100/H200) full of
dirty lines, and the timed call then pays their write-back while it streams its weights (Mixtral's FP8 GEMM1 at 1
token: 68.5 us with the written flush, 64.4 with the read one, on two H200s). MB_PROBE_FLUSH=write restores the written flush
(docs/measured/h200-2026-11-28-fp8 and h200-2026-11-28-woq were measured so)."""
import json, os, subprocess, sys, tempfile
import torch

from moe_build import kernels as K
from moe_build.bench.timing import flush_l2
from moe_build.kernels.abi import Fp8Scaling
from moe_build.kernels.ops import fp8_scale_shapes

# The FP8 probes' GEMMs, name: (experts, top_k, n, k): the bench shapes' and DeepSeek-V3's GEMM1 / GEMM2.
FP8_GEMMS = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "mixtral_g1": (8, 2, 28672, 4096),
             "mixtral_g2": (8, 2, 4096, 14336), "dsv2_g1": (64, 6, 2816, 2048), "dsv2_g2": (64, 6, 2048, 1408),
             "gptoss_g1": (32, 4, 5760, 2880), "gptoss_g2": (32, 4, 2880, 2880), "dsv3_g1": (256, 8, 4096, 7168),
             "dsv3_g2": (256, 8, 7168, 2048)}

_written_flush: torch.Tensor | None = None


def _flush_l2() -> None:
    global _written_flush
    if os.environ.get("MB_PROBE_FLUSH") == "write":
        if _written_flush is None:
            _written_flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        _written_flush.zero_()
        return
    flush_l2()


def tms(fn, iters=20):
    """Median GPU time of fn() in microseconds, L2 flushed before each call."""
    for _ in range(3): fn()
    ts = []
    for _ in range(iters):
        _flush_l2(); s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1000)
    ts.sort(); return ts[len(ts) // 2]


def read_rate() -> float:
    """HBM read rate in bytes/s: the faster of two read-only fp32 sums over 2 GiB of ones (a whole-tensor sum and a
    row sum), median of 10 each, over initialized memory (woq_gemm_probe.json of 2026-11-28 recorded 247 GB/s from a
    sum over 1 GiB of torch.empty: not an HBM rate, hence the two forms and the printed value to check)."""
    x = torch.ones(512 << 20, dtype=torch.float32, device="cuda")
    best = min(tms(lambda: x.sum(), iters=10), tms(lambda: x.view(-1, 4096).sum(dim=1), iters=10))
    return (2 << 30) / (best * 1e-6)


def decode_table(rows: list[dict], key: str, old: list[dict] | None, read_bps: float) -> None:
    """The decode tactics at 1 and 16 tokens: the touched experts' stored bytes over each K split's time as a fraction
    of the read rate, and the best one's time; with `old` (the same rows from an older library), its best beside it."""
    print(f"\nread rate {read_bps / 1e12:.2f} TB/s; decode at 1 and 16 tokens: touched experts' weights + scales "
          f"(+ zeros) / time, as a fraction of the read rate, per K split, and the best")
    old_by = {(r["gemm"], r[key], r["tokens"]): r for r in old or []}
    print(f"{'gemm':<11} {key:<9} {'tok':>3} {'MB':>7} {'floor us':>8}  ks1   ks2   ks4   ks8  {'best':<8} {'us':>7}" +
          ("   old: best      us   rate" if old else ""))
    for r in rows:
        dec = {t.split(":")[1]: v for t, v in r["times"].items() if t.startswith("decode:")}
        if r["tokens"] > 16 or not dec:
            continue
        floor = r["bytes"] / read_bps * 1e6
        best = min(dec, key=dec.get)
        fr = "".join(f"{floor / dec[t]:>5.0%} " if t in dec else "    - " for t in ("ksplit1", "ksplit2", "ksplit4",
                                                                                  "ksplit8"))
        line = (f"{r['gemm']:<11} {r[key]:<9} {r['tokens']:>3} {r['bytes'] / 1e6:>7.1f} {floor:>8.1f} {fr} "
                f"{best:<8} {dec[best]:>7.1f}")
        o = old_by.get((r["gemm"], r[key], r["tokens"]))
        if o:
            odec = {t.split(":")[1]: v for t, v in o["times"].items() if t.startswith("decode:")}
            ob = min(odec, key=odec.get)
            line += f"   {ob:<8} {odec[ob]:>7.1f} {floor / odec[ob]:>5.0%}"
        print(line)


def run_old(script: str, out_name: str) -> list[dict] | None:
    """With MB_PROBE_OLD_LIB set (a library path, build.json beside it), the probe `script` once more on that library
    in a child process (one library per process), its rows returned for the side-by-side table; else None."""
    old_lib = os.environ.get("MB_PROBE_OLD_LIB")
    if not old_lib:
        return None
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if k != "MB_PROBE_OLD_LIB"}
        env.update(MOE_BUILD_KERNELS_LIB=old_lib, OUT=d)
        print(f"\n--- the same probe on the old library {old_lib} ---", flush=True)
        subprocess.run([sys.executable, script], env=env, check=True)
        data = json.load(open(os.path.join(d, out_name)))
    return data["rows"] if isinstance(data, dict) else data


def woq_mixed_weights(kind, group: int, E: int, n: int, k: int) -> tuple[torch.Tensor, ...]:
    """Random weights for the mixed-input weight-only GEMM: int4 codes (two a byte) with zero points in groups of
    `group`, or int8 per channel (`group` 0), scales in [1e-3, 0.011) -> (b, zeros, scales, s_mn, z_mn): the stored
    form and the scales (and zero terms) handed over MN-major in bf16 (weights.woq.wgmma_scales)."""
    from moe_build.weights.woq import WoqKind, wgmma_scales
    g = group if group else k
    if kind is WoqKind.INT4:
        b = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda")
        zeros = torch.randint(0, 16, (E, n, k // g), dtype=torch.uint8, device="cuda")
    else:
        b = torch.randint(-128, 128, (E, n, k), dtype=torch.int8, device="cuda")
        zeros = None
    scales = torch.rand(E, n, k // g, device="cuda") * 0.01 + 1e-3
    return (b, zeros, scales, *wgmma_scales(kind, scales, zeros, torch.bfloat16))


def rowwise_fp8_problem(b: torch.Tensor, topk: int, tokens: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One rowwise FP8 grouped GEMM's operands for `tokens` tokens of top-`topk` routing over the experts of the e4m3
    weights `b` [E, n, k], drawn from `g`: uniform random routing's expert offsets, e4m3 rows, row and column
    scales in [0.5, 1.5), a bf16 output and the workspace -> (off, a, sa, sb, c, ws)."""
    E, n, k = b.shape
    R = tokens * topk
    ids = torch.randint(0, E, (R,), device="cuda", generator=g)
    off = torch.zeros(E + 1, dtype=torch.int64, device="cuda")
    off[1:] = torch.bincount(ids, minlength=E).cumsum(0)
    a = (torch.randn(R, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    sa_shape, sb_shape = fp8_scale_shapes(Fp8Scaling.ROWWISE, R, E, n, k)
    sa = torch.rand(sa_shape, device="cuda", generator=g) + 0.5
    sb = torch.rand(sb_shape, device="cuda", generator=g) + 0.5
    c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(E, R, n, k) + 1, dtype=torch.uint8, device="cuda")
    return off, a, sa, sb, c, ws
