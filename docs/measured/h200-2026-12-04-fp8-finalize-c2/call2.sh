# s07 call 2 (H200): FP8 rowwise at 128-384 tokens (8-48 rows an expert): GEMM2 (finalize epilogue) and GEMM1 forced
# onto the other tiles / launches beside the plan (pingpong64x128 both), whole layers, graph replay, two rounds.
source .device_carry/s07/go.sh
G2="wgmma:pingpong64x128:placed:evict_last wgmma:pingpong64x128:after_trigger:plain wgmma:pingpong64x128c2:after_trigger:evict_last wgmma:coop128x128:after_trigger:evict_last wgmma:pingpong128x128c2:after_trigger:evict_last decode:ksplit1:after_trigger:plain"
G1="wgmma:pingpong64x128:placed:evict_last wgmma:pingpong64x128:plain:plain wgmma:coop128x128:plain:evict_last"
V=ours
for t in $G2; do V="$V,ours:gemm2_tactic=$t"; done
for t in $G1; do V="$V,ours:gemm1_tactic=$t"; done
SECONDS=0
for r in 1 2; do
  [ $r = 2 ] && [ $SECONDS -gt 260 ] && break
  timeout 270 python3 -m moe_build bench --quant fp8 --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 128,256,384 --iters 5 --input-sets 2 --variants "$V" --json $OUT/g2_$r.json > $OUT/g2_$r.log 2>&1; echo "round $r rc=$?"
done
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
res = {}
for f in sorted(glob.glob(f"{out}/g2_[12].json")):
    for p in json.load(open(f))["points"]:
        for v, e in p["variants"].items():
            res.setdefault((p["shape"], p["tokens"]), {}).setdefault(v, []).append(e.get("graph_us") or e.get("error", "?")[:40])
for k in sorted(res):
    base = res[k]["ours"]
    print(k, "ours", base)
    for v, us in res[k].items():
        if v != "ours":
            print("   ", v.replace("ours:", "").replace(":evict_last", ":el").replace("after_trigger", "at"), [round(u, 1) if isinstance(u, float) else u for u in us])
PY
