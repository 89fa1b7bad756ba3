# s06 call 6 (H200): the mixed-input 32-row tile against the plan (64 rows past 16 average rows an expert) at 20, 24,
# 28 and 32 rows an expert, int4 layers (W4A16, W4AFP8) on the four bench shapes, 8-bit (W8A16, WFP4A16) on
# Qwen3-30B-A3B (the other three measured on 2026-12-04: the 32-row tile 0.85-0.95x at 18-28 rows, 1.16-1.24x at 32).
source .device_carry/s06/go.sh
X=wgmma:woq128x32:plain:plain
V="ours,ours:gemm1_tactic=$X+gemm2_tactic=$X"
run() {  # shape tokens quants
  timeout 150 python3 -m moe_build bench --quant $3 --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants "$V" \
    --json $OUT/tile32_$1.json > $OUT/tile32_$1.log 2>&1; echo "$1 rc=$?"
}
run mixtral-8x7b 80,96,112,128 w4a16_awq,w4afp8
run gpt-oss-20b 160,192,224,256 w4a16_awq,w4afp8
run deepseek-v2-lite 213,256,299,341 w4a16_awq,w4afp8
run qwen3-30b-a3b 320,384,448,512 w4a16_awq,w4afp8,w8a16,wfp4a16
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
tk = {"mixtral-8x7b": (8, 2), "qwen3-30b-a3b": (128, 8), "deepseek-v2-lite": (64, 6), "gpt-oss-20b": (32, 4)}
for f in sorted(glob.glob(f"{out}/tile32_*.json")):
    for p in json.load(open(f))["points"]:
        e, k = tk[p["shape"]]
        v = p["variants"]; ours = v["ours"].get("graph_us"); forced = [x for n, x in v.items() if n != "ours"][0]
        g1 = v["ours"].get("plan", {}).get("gemm1_tactic", "?")
        f_us = forced.get("graph_us")
        print(f"{p['quant']:<10}{p['shape']:<17}{p['tokens']:>5} rows {p['tokens'] * k / e:5.1f} plan {g1:<32} {ours or 0:8.1f} x32 {f_us or 0:8.1f} {((f_us or 0) / ours) if ours else 0:6.3f} {forced.get('error', '')[:80]}")
PY
