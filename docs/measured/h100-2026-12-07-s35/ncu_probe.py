"""One call of GPT-OSS-20B's FP8 block-128 layer at TOKENS tokens between cudaProfilerStart/Stop, for
`ncu --profile-from-start off`: its two decode GEMMs' memory and warp-state sections (why they read 1.7-2.1 TB/s at 3
tokens and 3.0 at 8)."""
import os
import sys

import torch

from moe_build.bench.workload import device_fp8_weights, fp8_bench_spec, make_inputs
from moe_build.runner import MoERunner
from moe_build.spec import Quant

tokens = int(sys.argv[1])
spec = fp8_bench_spec("gpt-oss-20b", Quant.FP8_BLOCK)
w = device_fp8_weights(spec, seed=1)
runner = MoERunner(spec, w, max_tokens=tokens)
s = make_inputs(spec, tokens, 1, seed=tokens, correction_bias=w.correction_bias)[0]
out = torch.empty_like(s.hidden)
for _ in range(3):
    runner(s.hidden, router_logits=s.logits, out=out)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
runner(s.hidden, router_logits=s.logits, out=out)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
