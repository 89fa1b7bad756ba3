"""One FP8 GEMM2 call (Qwen3-30B-A3B shape, 4096 tokens) for ncu: argv[1] store|finalize, argv[2] tile."""
import sys, torch
from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Scaling, Fp8Accumulation
from moe_build.kernels.ops import fp8_scale_shapes
epi, tile = sys.argv[1], sys.argv[2]
E, topk, n, k, tokens = 128, 8, 2048, 768, 4096
R = tokens * topk
ids = torch.stack([torch.randperm(E, device="cuda")[:topk] for _ in range(tokens)]).view(-1)
order = torch.argsort(ids, stable=True)
counts = torch.bincount(ids, minlength=E)
off = torch.zeros(E + 1, dtype=torch.int64, device="cuda"); off[1:] = counts.cumsum(0)
p2u = order.to(torch.int32); w = torch.rand(R, device="cuda")
b = torch.randn(E, n, k, device="cuda").to(torch.float8_e4m3fn)
a = torch.randn(R, k, device="cuda").to(torch.float8_e4m3fn)
sa_s, sb_s = fp8_scale_shapes(Fp8Scaling.ROWWISE, R, E, n, k)
sa, sb = torch.rand(sa_s, device="cuda"), torch.rand(sb_s, device="cuda")
c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda"); o = torch.zeros(tokens, n, dtype=torch.bfloat16, device="cuda")
ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(E, R, n, k) + 1, dtype=torch.uint8, device="cuda")
tac = f"wgmma:{tile}:plain:plain"
for _ in range(2):
    if epi == "store":
        K.grouped_gemm_fp8(a, sa, b, sb, off, "rowwise", c=c, workspace=ws, accumulation=Fp8Accumulation.FAST, tactic=tac)
    else:
        K.grouped_gemm_fp8_finalize(a, sa, b, sb, off, p2u, w, tokens, topk, "rowwise", out=o, workspace=ws,
                                    accumulation=Fp8Accumulation.FAST, tactic=tac)
torch.cuda.synchronize()
