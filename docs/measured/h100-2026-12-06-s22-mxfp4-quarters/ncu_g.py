"""One MXFP4 digits decode GEMM for ncu: argv[1] form (stored: main's library; quarters: the branch's), argv[2] shape,
argv[3] tokens, argv[4] K split."""
import sys, torch
from moe_build import kernels as K
G = {"mixtral_g1": (8, 2, 28672, 4096), "qwen3_g1": (128, 8, 1536, 2048), "gptoss_g1": (32, 4, 5760, 2880),
     "gptoss_g2": (32, 4, 2880, 2880)}
form, shape, tokens, ks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
E, top_k, n, k = G[shape]
torch.manual_seed(0)
ids = torch.stack([torch.randperm(E)[:top_k] for _ in range(tokens)]).view(-1)
counts = torch.bincount(ids, minlength=E)
off = torch.zeros(E + 1, dtype=torch.int64); off[1:] = counts.cumsum(0); off = off.cuda()
rows = tokens * top_k
a = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
b = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda")
s = torch.randint(118, 128, (E, n, k // 32), dtype=torch.uint8, device="cuda")
kind = "mxfp4"
if form == "quarters":
    from moe_build.weights.woq import mxfp4_quarters
    b, s = mxfp4_quarters(b, s); kind = "mxfp4_quarters"
c = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
dig = K.token_digits(a, group=32)
tac = f"decode:digits_ksplit{ks}:after_trigger:plain"
for _ in range(3):
    K.grouped_gemm_woq(dig, b, kind, s, off, 32, c=c, tactic=tac, out_dtype=torch.bfloat16)
torch.cuda.synchronize()
print("rows per expert", counts.tolist())
