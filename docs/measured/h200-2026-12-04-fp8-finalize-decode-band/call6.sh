# s07 call 6 (H200): rowwise FP8 in GEMM2's decode band (the finalize epilogue's crossing, never measured): GEMM2 forced
# onto pingpong64x128 (one CTA and 2x1 clusters) beside the plan's decode kernel, and GEMM1 onto pingpong64x128, whole
# layers, graph replay, two rounds where time allows.
source .device_carry/s07/go.sh
mkdir -p $OUT/r
G2A="ours:gemm2_tactic=wgmma:pingpong64x128:after_trigger:evict_last"
G2B="ours:gemm2_tactic=wgmma:pingpong64x128c2:after_trigger:evict_last"
G1A="ours:gemm1_tactic=wgmma:pingpong64x128:plain:plain"
SECONDS=0
for r in 1 2; do
  [ $r = 2 ] && [ $SECONDS -gt 200 ] && break
  for s in "qwen3-30b-a3b 8,16,24" "deepseek-v2-lite 8,16,32" "gpt-oss-20b 8,16,32,48" "mixtral-8x7b 4,8,16,24" "deepseek-v3 8,16,24"; do
    set -- $s
    timeout 90 python3 -m moe_build bench --quant fp8 --shapes $1 --tokens $2 --iters 5 --input-sets 2 --variants "ours,$G2A,$G2B,$G1A" --json $OUT/r/${1}_$r.json > $OUT/r/${1}_$r.log 2>&1 || echo "$1 $r failed"
  done
done
echo "elapsed ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT r
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
res = {}
for f in sorted(glob.glob(f"{out}/r/*_[12].json")):
    for p in json.load(open(f))["points"]:
        for v, e in p["variants"].items():
            k = "plan" if v == "ours" else v.split("=", 1)[1].split(":")[1] + ("/g1" if "gemm1" in v else "")
            res.setdefault((p["shape"], p["tokens"]), {}).setdefault(k, []).append(round(e["graph_us"], 1) if e.get("graph_us") else e.get("error", "?")[:40])
            if v == "ours": res[(p["shape"], p["tokens"])]["tactics"] = [e.get("plan", {}).get("gemm1_tactic", "?")[:22] + " " + e.get("plan", {}).get("gemm2_tactic", "?")[:22]]
for k in sorted(res):
    print(k, res[k])
PY
