"""One W4A16 decode GEMM (Mixtral-8x7B GEMM1, int4 group 128 with zeros) for ncu: argv[1] the form (staged or
digits), argv[2] the rows of each of the 8 experts (comma-separated, e.g. 1,0,0,1,0,0,0,0)."""
import sys, torch
from moe_build import kernels as K
form, counts = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
E, n, k, g = 8, 28672, 4096, 128
off = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0).cuda()
rows = sum(counts)
a = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
b = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda")
s = torch.rand(E, n, k // g, device="cuda") * 0.01
z = torch.randint(0, 16, (E, n, k // g), dtype=torch.uint8, device="cuda")
c = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
dig = K.token_digits(a)
tac = f"decode:{form}_ksplit1:after_trigger:plain"
for _ in range(3):
    if form == "digits":
        K.grouped_gemm_woq(dig, b, "int4", s, off, g, zeros=z, c=c, tactic=tac, out_dtype=torch.bfloat16)
    else:
        K.grouped_gemm_woq(a, b, "int4", s, off, g, zeros=z, c=c, tactic=tac)
torch.cuda.synchronize()
