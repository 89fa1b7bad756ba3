"""Session probe: does the FP8 wgmma GEMM's weight access pattern (128 rows x 128 B boxes of a row-major
[E, N, K] tensor, N tiles of one expert side by side) read HBM slower than contiguous 16 KB blocks?"""
import json, os, sys
import torch, triton, triton.language as tl

@triton.jit
def tiles_kernel(w, out, NT: tl.constexpr, K: tl.constexpr, N: tl.constexpr, BLOCKED: tl.constexpr,
                 ROWS: tl.constexpr, KB: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    e = pid // NT
    n = pid % NT
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, KB)[None, :]
    acc = tl.zeros([ROWS, KB], dtype=tl.int32)
    nkb: tl.constexpr = K // KB
    for kb in tl.range(0, nkb, num_stages=STAGES):
        if BLOCKED:
            base = ((e.to(tl.int64) * NT + n) * nkb + kb) * (ROWS * KB)
            x = tl.load(w + base + r * KB + c)
        else:
            base = e.to(tl.int64) * N * K + (n * ROWS).to(tl.int64) * K + kb * KB
            x = tl.load(w + base + r * K + c)
        acc += x.to(tl.int32)
    tl.store(out + pid, tl.sum(acc))

def bench(fn, flush, reps=10):
    ts = []
    for _ in range(reps):
        flush.sum()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    ts.sort(); return ts[len(ts) // 2]

def main():
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").view(torch.float32)
    big = torch.ones(1 << 28, dtype=torch.float32, device="cuda")
    rd = bench(lambda: big.sum(), flush)
    print(f"read rate (1 GiB float sum): {big.numel() * 4 / rd / 1e6:.2f} TB/s")
    res = []
    for name, E, N, K in (("qwen3_g1", 128, 1536, 2048), ("qwen3_g2", 128, 2048, 768), ("dsv2_g1", 64, 2816, 2048),
                          ("dsv2_g2", 64, 2048, 1408), ("gptoss_g1", 32, 5760, 2880 - 2880 % 128)):
        w = torch.randint(0, 255, (E, N, K), dtype=torch.uint8, device="cuda")
        for rows in (128, 64):
            NT = N // rows
            out = torch.empty(E * NT, dtype=torch.int32, device="cuda")
            for blocked in (0, 1):
                for warps, stages in ((4, 3), (8, 4)):
                    f = lambda: tiles_kernel[(E * NT,)](w, out, NT, K, N, blocked, rows, 128, stages, num_warps=warps)
                    f(); torch.cuda.synchronize()
                    us = bench(f, flush)
                    tbs = w.numel() / us / 1e6
                    res.append(dict(gemm=name, rows=rows, blocked=blocked, warps=warps, stages=stages, us=us, tb_s=tbs))
                    print(f"{name:10s} box {rows}x128B {'blocked ' if blocked else 'rowmajor'} w{warps}s{stages}: {us:8.1f} us {tbs:5.2f} TB/s", flush=True)
        del w
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "access_probe.json"), "w"), indent=1)

main()
