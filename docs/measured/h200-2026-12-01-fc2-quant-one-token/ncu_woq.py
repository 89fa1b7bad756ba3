"""One W4A16 decode GEMM (Mixtral-8x7B GEMM1 at 1 token: 2 experts of 8, one row each; int4 group 128 with zeros)
for ncu, on the plan's staged kernel: argv[1] the tactic (default decode:staged_ksplit1:after_trigger:plain)."""
import sys, torch
from moe_build import kernels as K
tac = sys.argv[1] if len(sys.argv) > 1 else "decode:staged_ksplit1:after_trigger:plain"
E, n, k, g = 8, 28672, 4096, 128
off = torch.tensor([0, 1, 1, 1, 2, 2, 2, 2, 2], dtype=torch.int64, device="cuda")
a = torch.randn(2, k, device="cuda").to(torch.bfloat16)
b = torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda")
s = torch.rand(E, n, k // g, device="cuda") * 0.01
z = torch.randint(0, 16, (E, n, k // g), dtype=torch.uint8, device="cuda")
c = torch.empty(2, n, dtype=torch.bfloat16, device="cuda")
for _ in range(3):
    K.grouped_gemm_woq(a, b, "int4", s, off, g, zeros=z, c=c, tactic=tac)
torch.cuda.synchronize()
