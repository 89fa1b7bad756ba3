# s06 call 9 (H200): block-128 FP8 at 33-40 rows an expert on the three shapes whose GEMM1 cannot be forced (its decode
# band runs the gated epilogue): this tree's plan (pingpong 64x128 to 40 rows) against the same plan with the old bound
# (32 rows, then coop 128x128), set in the process before the bench runs; two rounds, alternated.
source .device_carry/s06/go.sh
OLD="import sys, moe_build.planner.tactics as t; t.FP8_BLOCK_NARROW_MAX_AVG_ROWS = 32; sys.argv[0] = 'moe-build'; from moe_build.cli import main; main()"
for r in 1 2; do
for s in "qwen3-30b-a3b 528,576,640" "deepseek-v2-lite 352,384,426" "gpt-oss-20b 264,288,320"; do
  set -- $s
  timeout 60 python3 -m moe_build bench --quant fp8_block --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants ours --json $OUT/new_${1}_$r.json > $OUT/new_${1}_$r.log 2>&1 || echo "new $1 failed"
  timeout 60 python3 -c "$OLD" bench --quant fp8_block --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants ours --json $OUT/old_${1}_$r.json > $OUT/old_${1}_$r.log 2>&1 || echo "old $1 failed"
done
done
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
res = {}
for f in glob.glob(f"{out}/*_*_[12].json"):
    side = os.path.basename(f).split("_")[0]
    for p in json.load(open(f))["points"]:
        v = p["variants"]["ours"]
        res.setdefault((p["shape"], p["tokens"]), {}).setdefault(side, []).append((round(v.get("graph_us") or 0, 1), v.get("plan", {}).get("gemm1_tactic", "?").split(":")[1], v.get("plan", {}).get("gemm2_tactic", "?").split(":")[1]))
for k in sorted(res):
    print(k, "old", res[k].get("old"), "new", res[k].get("new"))
PY
