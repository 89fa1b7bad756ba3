"""Session probe: the FP8 stream kernel against the register decode kernel, the wgmma tile and the Triton kernel of
gemm_probe.py, GEMMs alone (plain store), equal and routed rows per expert."""
import json, os, sys
import torch
sys.path.insert(0, os.path.dirname(__file__))
from gemm_probe import gemm_kernel, bench
from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Scaling

flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").view(torch.float32)
big = torch.ones(1 << 28, dtype=torch.float32, device="cuda")
rd = big.numel() * 4 / bench(lambda: big.sum(), flush) / 1e6
print(f"read rate {rd:.2f} TB/s")
f8 = torch.float8_e4m3fn
res = []
for name, E, N, K_, R in (("qwen3_g1", 128, 1536, 2048, 16), ("qwen3_g2", 128, 2048, 768, 16),
                          ("dsv2_g1", 64, 2816, 2048, 24), ("qwen3_g1_r2", 128, 1536, 2048, 2)):
    b = (torch.randn(E, N, K_, device="cuda") * 0.5).to(f8)
    sb = torch.rand(E, N, device="cuda") + 0.5
    floor = b.numel() / rd / 1e6
    for routing in ("equal", "routed"):
        if routing == "equal":
            counts = [R] * E
        else:
            g = torch.Generator().manual_seed(0)
            counts = torch.bincount(torch.randint(0, E, (E * R,), generator=g), minlength=E).tolist()
        rows = sum(counts)
        a = torch.randn(rows, K_, device="cuda").to(f8)
        sa = torch.rand(rows, device="cuda") + 0.5
        off = torch.tensor([0] + counts).cumsum(0).cuda()
        c = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
        line = {}
        for t in ("decode:stream8_ksplit1:plain:plain", "decode:stream16_ksplit1:plain:plain",
                  "decode:stream32_ksplit1:plain:plain", "decode:ksplit1:plain:plain", "decode:ksplit2:plain:plain",
                  "wgmma:pingpong64x128:plain:plain"):
            f = lambda: K.grouped_gemm_fp8(a, sa, b, sb, off, Fp8Scaling.ROWWISE, c=c, tactic=t)
            f(); torch.cuda.synchronize()
            line[t.split(":")[1] if t.startswith("decode") else "pp64x128"] = bench(f, flush)
        if routing == "equal":
            BM = max(16, 1 << (R - 1).bit_length())
            ct = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
            f = lambda: gemm_kernel[(E * (N // 64),)](a, b, sa, sb, ct, R, N, K_, N // 64, BM, 64, 128, 1, 5, num_warps=4)
            f(); torch.cuda.synchronize()
            line["triton"] = bench(f, flush)
        res.append(dict(gemm=name, routing=routing, floor=floor, us=line))
        print(f"{name:12s} {routing:6s} floor {floor:6.1f}: " + " ".join(f"{k}={v:.1f}" for k, v in line.items()), flush=True)
    del b
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "stream_probe.json"), "w"), indent=1)
