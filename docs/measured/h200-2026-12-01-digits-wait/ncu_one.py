"""One W4A16 decode GEMM for ncu (int4 group 128 with zeros): argv[1] form (staged|digits), argv[2] shape
(mixtral_g1|mixtral_g2|qwen3_g1|qwen3_g2|dsv2_g1|dsv2_g2), argv[3] tokens (routed top-k at random), argv[4] K split."""
import sys, torch
from moe_build import kernels as K
G = {"mixtral_g1": (8, 2, 28672, 4096), "mixtral_g2": (8, 2, 4096, 14336), "qwen3_g1": (128, 8, 1536, 2048),
     "qwen3_g2": (128, 8, 2048, 768), "dsv2_g1": (64, 6, 2816, 2048), "dsv2_g2": (64, 6, 2048, 1408)}
form, shape, tokens, ks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
E, top_k, n, k = G[shape]
torch.manual_seed(0)
ids = torch.stack([torch.randperm(E)[:top_k] for _ in range(tokens)]).view(-1)
counts = torch.bincount(ids, minlength=E)
off = torch.zeros(E + 1, dtype=torch.int64); off[1:] = counts.cumsum(0); off = off.cuda()
rows = tokens * top_k
a = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
b = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda")
s = torch.rand(E, n, k // 128, device="cuda") * 0.01
z = torch.randint(0, 16, (E, n, k // 128), dtype=torch.uint8, device="cuda")
c = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
dig = K.token_digits(a)
tac = f"decode:{form}_ksplit{ks}:after_trigger:plain"
for _ in range(3):
    if form == "digits":
        K.grouped_gemm_woq(dig, b, "int4", s, off, 128, zeros=z, c=c, tactic=tac, out_dtype=torch.bfloat16)
    else:
        K.grouped_gemm_woq(a, b, "int4", s, off, 128, zeros=z, c=c, tactic=tac)
torch.cuda.synchronize()
