# s07 call 3 (H200): the narrow FP8 tiles in 2x1 clusters (pingpong64x128c2) beside the plan's one-CTA pingpong64x128
# at 8-48 rows an expert: rowwise GEMM2 (finalize) on Mixtral-8x7B and DeepSeek-V3; block-128 GEMM1 / GEMM2 on the four
# smaller shapes at their 16- and 256-token points. Whole layers, graph replay, two rounds.
source .device_carry/s07/go.sh
C2G2="ours:gemm2_tactic=wgmma:pingpong64x128c2:after_trigger:evict_last"
C2G1="ours:gemm1_tactic=wgmma:pingpong64x128c2:plain:plain"
SECONDS=0
for r in 1 2; do
  [ $r = 2 ] && [ $SECONDS -gt 250 ] && break
  timeout 150 python3 -m moe_build bench --quant fp8 --shapes mixtral-8x7b --tokens 32,64,128,192 --iters 5 --input-sets 2 --variants "ours,$C2G2" --json $OUT/rw_mixtral_$r.json > $OUT/rw_mixtral_$r.log 2>&1; echo "rw mixtral $r rc=$?"
  timeout 150 python3 -m moe_build bench --quant fp8 --shapes deepseek-v3 --tokens 256,512,1024 --iters 5 --input-sets 2 --variants "ours,$C2G2" --json $OUT/rw_dsv3_$r.json > $OUT/rw_dsv3_$r.log 2>&1; echo "rw dsv3 $r rc=$?"
  timeout 150 python3 -m moe_build bench --quant fp8_block --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 16,256 --iters 5 --input-sets 2 --variants "ours,$C2G2,$C2G1,$C2G1+gemm2_tactic=wgmma:pingpong64x128c2:after_trigger:evict_last" --json $OUT/blk_$r.json > $OUT/blk_$r.log 2>&1; echo "blk $r rc=$?"
done
python3 - <<'PY'
import json, os, glob
out = os.environ["OUT"]
res = {}
for f in sorted(glob.glob(f"{out}/*_[12].json")):
    for p in json.load(open(f))["points"]:
        for v, e in p["variants"].items():
            res.setdefault((p["quant"], p["shape"], p["tokens"]), {}).setdefault(v, []).append(e.get("graph_us") or e.get("error", "?")[:60])
for k in sorted(res):
    print(k)
    for v, us in res[k].items():
        print("   ", v.replace("ours:", "").replace(":evict_last", ":el").replace("after_trigger", "at"), [round(u, 1) if isinstance(u, float) else u for u in us])
PY
