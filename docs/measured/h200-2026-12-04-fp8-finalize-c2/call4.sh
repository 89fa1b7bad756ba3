# s07 call 4 (H200): the finalize GEMM2 on pingpong64x128c2 to 48 rows an expert (this tree's plan, "ours") beside the
# old plan's pingpong64x128 forced, at the first wgmma counts (1-7 rows an expert) and the bench's 256 tokens, rowwise
# FP8 with dynamic and static input scales, whole layers, graph replay, two rounds where time allows.
source .device_carry/s07/go.sh
OLD="ours:gemm2_tactic=wgmma:pingpong64x128:after_trigger:evict_last"
mkdir -p $OUT/r
SECONDS=0
for r in 1 2; do
  [ $r = 2 ] && [ $SECONDS -gt 270 ] && break
  for q in fp8 fp8_static; do
    for s in "qwen3-30b-a3b 32,64,96,256" "deepseek-v2-lite 43,64,256" "gpt-oss-20b 49,256" "mixtral-8x7b 28,192" "deepseek-v3 32,64,128,512"; do
      set -- $s
      timeout 100 python3 -m moe_build bench --quant $q --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants "ours,$OLD" --json $OUT/r/${q}_${1}_$r.json > $OUT/r/${q}_${1}_$r.log 2>&1 || echo "$q $1 $r failed"
    done
  done
done
echo "elapsed $SECONDS s"
tar czf $OUT/results.tgz -C $OUT r
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
res = {}
for f in sorted(glob.glob(f"{out}/r/*_[12].json")):
    for p in json.load(open(f))["points"]:
        v = p["variants"]
        new, old = v["ours"], v["ours:gemm2_tactic=wgmma:pingpong64x128:after_trigger:evict_last"]
        res.setdefault((p["quant"], p["shape"], p["tokens"]), []).append((new.get("graph_us"), old.get("graph_us"), new.get("plan", {}).get("gemm2_tactic", "?"), new.get("error", ""), old.get("error", "")))
for k in sorted(res):
    rs = res[k]
    print(f"{k[0]:<10} {k[1]:<17} {k[2]:>4}  new " + " ".join(f"{a:7.1f}" if a else "   err " for a, *_ in rs) + "  old " + " ".join(f"{b:7.1f}" if b else "   err " for _, b, *_ in rs) + "  " + rs[0][2].replace("after_trigger", "at") + (" " + rs[0][3][:60] + rs[0][4][:60] if rs[0][3] or rs[0][4] else ""))
PY
