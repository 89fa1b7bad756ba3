"""One weight-only layer called eagerly a few times (for ncu): QUANT SHAPE TOKENS [stage=choice ...]."""
import sys

import torch

from moe_build.bench.woq_layer import QUANTS, device_woq_weights, woq_bench_spec
from moe_build.bench.workload import make_inputs
from moe_build.runner import MoERunner

quant_name, shape, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
force = dict(a.split("=", 1) for a in sys.argv[4:])
quant, act_scale = QUANTS[quant_name]
spec = woq_bench_spec(shape, quant, act_scale)
w = device_woq_weights(spec, quant, seed=1)
runner = MoERunner(spec, w, max_tokens=tokens, force=force)
s = make_inputs(spec, tokens, 1, seed=tokens, correction_bias=w.correction_bias)[0]
for _ in range(3):
    runner(s.hidden, s.logits)
torch.cuda.synchronize()
print(runner.kernel_sequence(tokens, "logits"))
