# s06 call 7 (H200): the mixed-input 64- and 128-row tiles at 40-56 average rows an expert (the plan: 64 to 48 rows,
# 128 from 49), both GEMMs forced onto each beside the plan, W4A16 and W8A16 on the four bench shapes.
source .device_carry/s06/go.sh
A=wgmma:woq128x64:plain:plain; B=wgmma:woq128x128:plain:plain
V="ours,ours:gemm1_tactic=$A+gemm2_tactic=$A,ours:gemm1_tactic=$B+gemm2_tactic=$B"
run() {  # shape tokens
  timeout 130 python3 -m moe_build bench --quant w4a16_awq,w8a16 --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants "$V" \
    --json $OUT/tile64_$1.json > $OUT/tile64_$1.log 2>&1; echo "$1 rc=$?"
}
run mixtral-8x7b 160,176,192,208,224
run gpt-oss-20b 320,352,384,416,448
run deepseek-v2-lite 426,469,512,554,597
run qwen3-30b-a3b 640,704,768,832,896
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
tk = {"mixtral-8x7b": (8, 2), "qwen3-30b-a3b": (128, 8), "deepseek-v2-lite": (64, 6), "gpt-oss-20b": (32, 4)}
for f in sorted(glob.glob(f"{out}/tile64_*.json")):
    for p in json.load(open(f))["points"]:
        e, k = tk[p["shape"]]
        v = p["variants"]; ours = v["ours"].get("graph_us") or 0
        g1 = v["ours"].get("plan", {}).get("gemm1_tactic", "?").split(":")[1]
        xs = [x.get("graph_us") or 0 for n, x in v.items() if n != "ours"]
        print(f"{p['quant']:<10}{p['shape']:<17}{p['tokens']:>5} rows {-(-p['tokens'] * k // e):3d} plan {g1:<11} {ours:8.1f} x64 {xs[0] / ours:6.3f} x128 {xs[1] / ours:6.3f}")
PY
