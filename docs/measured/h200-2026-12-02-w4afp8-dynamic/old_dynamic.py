"""s30: the W4AFP8 bench layers with per-row (dynamic) FP8 scales on HEAD f5e10db's code and library (e4m3 rows on
the weight-only decode / mma kernels), for the side-by-side with the dequantized path. argv: out.json tokens."""
import dataclasses
import sys

from moe_build.bench import woq_layer as W
from moe_build.spec import ActScale, Quant

spec_of, weights_of = W.woq_bench_spec, W.device_woq_weights
W.woq_bench_spec = lambda name, quant: spec_of(name, quant).with_overrides(act_scale=ActScale.DYNAMIC)


def dynamic_weights(spec, quant, seed):
    w = weights_of(spec, quant, seed)
    return dataclasses.replace(w, woq=dataclasses.replace(w.woq, a1_scale=None, a2_scale=None))


W.device_woq_weights = dynamic_weights
tokens = [int(t) for t in sys.argv[2].split(",")]
res = W.run_woq_bench([Quant.W4AFP8], tokens_list=tokens, out_json=sys.argv[1], iters=5, warmup=3, input_sets=2,
                      variants=["ours", "ours_bf16"], log=lambda s: print(s, file=sys.stderr))
assert all(p["variants"]["ours"].get("plan", {}).get("gemm1_tactic", "").split(":")[0] in ("decode", "mma")
           for p in res["points"]), "not the e4m3 path"
print(W.table(res))
