# s19 call 6: block-128 layers' GEMM tiles at 1024/4096 tokens: the rule's coop128x128 against the pingpong 64x128
# tiles (one CTA and 2x1 clusters) forced on each GEMM, this tree's library (lib_s19d), one process.
V=ours,ours_bf16
for g in pingpong64x128 pingpong64x128c2; do
  V=$V,ours:gemm1_tactic=wgmma:$g:plain:plain,ours:gemm2_tactic=wgmma:$g:plain:evict_last
done
timeout 330 python -m moe_build bench --quant fp8_block --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b \
  --tokens 1024,4096 --variants $V --iters 5 --json $OUT/bench_block_tiles.json > $OUT/bench_block_tiles.log 2>&1 || echo "bench rc=$?"
python - <<'PY'
import json, os
d = json.load(open(f"{os.environ['OUT']}/bench_block_tiles.json"))
for p in d["points"]:
    v = p["variants"]
    print(f"{p['shape'][:12]:12} {p['tokens']:5} " + "  ".join(f"{k.replace('ours:', '').replace('wgmma:', '')[:34]} {x.get('graph_us') or 0:7.1f}" for k, x in v.items()))
PY
