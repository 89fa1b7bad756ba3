"""Session probe: how fast can a plain (non-persistent) FP8 grouped GEMM stream the weights at 2-48 rows per expert?
Triton, tokens as M (normal) or the weights as M (swapped), against a read of the same weights in the same pattern."""
import json, os, itertools
import torch, triton, triton.language as tl

@triton.jit
def gemm_kernel(a, b, sa, sb, c, R: tl.constexpr, N: tl.constexpr, K: tl.constexpr, NT: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    e = pid // NT
    n = pid % NT
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptr = a + (e * R + rm[:, None]).to(tl.int64) * K + rk[None, :]
    b_ptr = b + e.to(tl.int64) * N * K + (n * BN + rn[:, None]).to(tl.int64) * K + rk[None, :]
    mmask = rm[:, None] < R
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kb in tl.range(0, K // BK, num_stages=STAGES):
        x = tl.load(a_ptr + kb * BK, mask=mmask, other=0.0)
        w = tl.load(b_ptr + kb * BK)
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    s_a = tl.load(sa + e * R + rm, mask=rm < R, other=0.0)
    s_b = tl.load(sb + e * N + n * BN + rn)
    if SWAP:
        acc = acc * s_b[:, None] * s_a[None, :]
        tl.store(c + (e * R + rm[None, :]).to(tl.int64) * N + n * BN + rn[:, None], acc.to(tl.bfloat16),
                 mask=rm[None, :] < R)
    else:
        acc = acc * s_a[:, None] * s_b[None, :]
        tl.store(c + (e * R + rm[:, None]).to(tl.int64) * N + n * BN + rn[None, :], acc.to(tl.bfloat16), mask=mmask)

def bench(fn, flush, reps=15):
    ts = []
    for _ in range(reps):
        flush.sum()
        torch.cuda._sleep(400000)  # ~200 us: the host enqueues the call before the GPU reaches it
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    ts.sort(); return ts[len(ts) // 2]

def main():
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").view(torch.float32)
    big = torch.ones(1 << 28, dtype=torch.float32, device="cuda")
    rd = big.numel() * 4 / bench(lambda: big.sum(), flush) / 1e6
    print(f"read rate: {rd:.2f} TB/s")
    res = []
    f8 = torch.float8_e4m3fn
    for name, E, N, K, rows_list in (("qwen3_g1", 128, 1536, 2048, (2, 16)), ("qwen3_g2", 128, 2048, 768, (2, 16)),
                                     ("dsv2_g1", 64, 2816, 2048, (2, 24)), ("dsv2_g2", 64, 2048, 1408, (2, 24)),
                                     ("gptoss_g1", 32, 5760, 2816, (2,)), ("gptoss_g2", 32, 2880, 2816, (2,))):
        b = (torch.randn(E, N, K, device="cuda") * 0.5).to(f8)
        sb = torch.rand(E, N, device="cuda") + 0.5
        floor = b.numel() / rd / 1e6
        for R in rows_list:
            a = (torch.randn(E * R, K, device="cuda")).to(f8)
            sa = torch.rand(E * R, device="cuda") + 0.5
            c = torch.empty(E * R, N, device="cuda", dtype=torch.bfloat16)
            ref = None
            best = None
            bm0 = max(16, 1 << (R - 1).bit_length())
            for swap, BN, BM, warps, stages in itertools.product((0, 1), (64, 128), (bm0,), (4,), (3, 5)):
                if N % BN or (not swap and BM < 16) or BM < R and BM < 16: continue
                if BM < R: continue
                NT = N // BN
                f = lambda: gemm_kernel[(E * NT,)](a, b, sa, sb, c, R, N, K, NT, BM, BN, 128, swap, stages, num_warps=warps)
                try:
                    c.fill_(float("nan")); f(); torch.cuda.synchronize()
                except Exception as ex:
                    print(f"  {name} R={R} swap={swap} BN={BN} BM={BM} w{warps} s{stages}: {type(ex).__name__}", flush=True)
                    continue
                if ref is None:
                    e0 = 3
                    ref = (a[e0 * R:(e0 + 1) * R].float() @ b[e0].float().t()) * sa[e0 * R:(e0 + 1) * R, None] * sb[e0][None, :]
                err = ((c[e0 * R:(e0 + 1) * R].float() - ref).norm() / ref.norm()).item()
                us = bench(f, flush)
                r = dict(gemm=name, rows=R, swap=swap, BN=BN, BM=BM, warps=warps, stages=stages, us=us, floor_us=floor,
                         frac=floor / us, err=err)
                res.append(r)
                if best is None or us < best["us"]: best = r
            print(f"{name} rows {R}: floor {floor:.1f} us; best {best['us']:.1f} us ({best['frac']:.2f} of read) "
                  f"swap={best['swap']} BN={best['BN']} BM={best['BM']} w{best['warps']} s{best['stages']} err {best['err']:.1e}", flush=True)
            for sw in (0, 1):
                rs = [x for x in res if x['gemm'] == name and x['rows'] == R and x['swap'] == sw]
                if rs:
                    x = min(rs, key=lambda x: x['us'])
                    print(f"    swap={sw}: {x['us']:.1f} us BN={x['BN']} BM={x['BM']} w{x['warps']} s{x['stages']} err {x['err']:.1e}")
        del b
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "gemm_probe.json"), "w"), indent=1)

if __name__ == "__main__":
    main()
