# s07 call 7 (H200): this tree's plan (the short-K finalize GEMM2 off the decode kernel past 1 average row an expert)
# against the same plan with the old band (6 rows) set in the process, rowwise FP8 with dynamic and static input
# scales, at the counts that move on three shapes; whole layers, graph replay, two rounds alternated.
source .device_carry/s07/go.sh
mkdir -p $OUT/r
OLD="import sys, moe_build.planner.tactics as t; t.FP8_FINALIZE_DECODE_MAX_AVG_ROWS = 6; sys.argv[0] = 'moe-build'; from moe_build.cli import main; main()"
SECONDS=0
for r in 1 2; do
  [ $r = 2 ] && [ $SECONDS -gt 230 ] && break
  for q in fp8 fp8_static; do
    for s in "qwen3-30b-a3b 16,24" "deepseek-v2-lite 16,32" "gpt-oss-20b 16,32,48"; do
      set -- $s
      timeout 60 python3 -m moe_build bench --quant $q --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants ours --json $OUT/r/new_${q}_${1}_$r.json > $OUT/r/new_${q}_${1}_$r.log 2>&1 || echo "new $q $1 failed"
      timeout 60 python3 -c "$OLD" bench --quant $q --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants ours --json $OUT/r/old_${q}_${1}_$r.json > $OUT/r/old_${q}_${1}_$r.log 2>&1 || echo "old $q $1 failed"
    done
  done
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT r
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
res = {}
for f in sorted(glob.glob(f"{out}/r/*_[12].json")):
    side = os.path.basename(f).split("_")[0]
    for p in json.load(open(f))["points"]:
        v = p["variants"]["ours"]
        res.setdefault((p["quant"], p["shape"], p["tokens"]), {}).setdefault(side, []).append((round(v.get("graph_us") or 0, 1), v.get("plan", {}).get("gemm2_tactic", "?")[:24]))
for k in sorted(res):
    print(k, "new", res[k].get("new"), "old", res[k].get("old"))
PY
