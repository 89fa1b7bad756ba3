# s06 call 8 (H200): block-128 FP8 at 36-56 rows an expert, both GEMMs forced onto pingpong 64x128 (the plan's tile to
# 32 rows) beside the plan's coop 128x128, Mixtral-8x7B and DeepSeek-V3.
source .device_carry/s06/go.sh
V="ours,ours:gemm1_tactic=wgmma:pingpong64x128:plain:plain+gemm2_tactic=wgmma:pingpong64x128:plain:evict_last"
timeout 120 python3 -m moe_build bench --quant fp8_block --shapes mixtral-8x7b --tokens 132,144,160,176,192,224 --iters 5 --input-sets 2 --variants "$V" --json $OUT/pp64_mixtral.json > $OUT/pp64_mixtral.log 2>&1; echo "mixtral rc=$?"
timeout 200 python3 -m moe_build bench --quant fp8_block --shapes deepseek-v3 --tokens 1056,1152,1280,1408,1536,1792 --iters 5 --input-sets 2 --variants "$V" --json $OUT/pp64_dsv3.json > $OUT/pp64_dsv3.log 2>&1; echo "dsv3 rc=$?"
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
tk = {"mixtral-8x7b": (8, 2), "deepseek-v3": (256, 8)}
for f in sorted(glob.glob(f"{out}/pp64_*.json")):
    for p in json.load(open(f))["points"]:
        e, k = tk[p["shape"]]
        v = p["variants"]; ours = v["ours"].get("graph_us") or 0
        g1 = v["ours"].get("plan", {}).get("gemm1_tactic", "?").split(":")[1]
        xs = [x.get("graph_us") or 0 for n, x in v.items() if n != "ours"]
        print(f"{p['shape']:<14}{p['tokens']:>5} rows {-(-p['tokens'] * k // e):3d} plan {g1:<14} {ours:8.1f} pp64 {xs[0]:8.1f} {xs[0] / ours:6.3f}")
PY
