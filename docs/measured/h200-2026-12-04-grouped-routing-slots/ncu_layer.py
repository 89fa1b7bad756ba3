"""One bench layer's runner called a few times at a token count, for ncu: argv shape quant tokens."""
import sys, torch
sys.path.insert(0, "bench")
from layer_steps_probe import bench_layer
from moe_build.bench.workload import make_inputs
from moe_build.runner import MoERunner
name, quant, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec, w = bench_layer(quant, name, seed=1)
force = dict(kv.split("=", 1) for kv in sys.argv[4].split("+")) if len(sys.argv) > 4 else None
runner = MoERunner(spec, w, max_tokens=T, force=force)
s = make_inputs(spec, T, 1, seed=T, correction_bias=w.correction_bias)[0]
out = torch.empty_like(s.hidden)
for _ in range(5):
    runner(s.hidden, router_logits=s.logits, out=out)
torch.cuda.synchronize()
print("done", name, quant, T)
