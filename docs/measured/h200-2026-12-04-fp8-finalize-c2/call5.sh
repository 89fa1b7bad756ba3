# s07 call 5 (H200): the FP8 bench points on this tree (69cbb8d: the finalize GEMM2 in 2x1 clusters), rowwise and
# block-128 at 1 / 16 / 256 tokens, five shapes (ours and its floor); and Mixtral-8x7B's block-128 layer at 256 tokens
# (64 rows an expert) with both GEMMs forced onto the other blockwise tiles beside the plan's coop 128x128.
source .device_carry/s07/go.sh
mkdir -p $OUT/r
SECONDS=0
timeout 240 python3 -m moe_build bench --quant fp8,fp8_block --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,deepseek-v3 --tokens 1,16,256 --iters 10 --input-sets 2 --variants ours --json $OUT/r/bench_fp8.json > $OUT/r/bench_fp8.log 2>&1; echo "bench rc=$? ${SECONDS}s"
V=ours
for t in pingpong64x128 pingpong64x128c2 coop128x128c2; do V="$V,ours:gemm1_tactic=wgmma:$t:plain:plain+gemm2_tactic=wgmma:$t:after_trigger:evict_last"; done
timeout 150 python3 -m moe_build bench --quant fp8_block --shapes mixtral-8x7b --tokens 224,256,288 --iters 5 --input-sets 2 --variants "$V" --json $OUT/r/mixtral_block.json > $OUT/r/mixtral_block.log 2>&1; echo "mixtral rc=$? ${SECONDS}s"
tar czf $OUT/results.tgz -C $OUT r
grep -E "^\s*(fp8|\||[a-z0-9-]+ +[0-9])" $OUT/r/bench_fp8.log | tail -45
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for p in json.load(open(f"{out}/r/mixtral_block.json"))["points"]:
    print(p["shape"], p["tokens"], {v.split("gemm1_tactic=wgmma:")[-1].split(":")[0]: (round(e["graph_us"], 1) if e.get("graph_us") else e.get("error", "?")[:50]) for v, e in p["variants"].items()})
PY
