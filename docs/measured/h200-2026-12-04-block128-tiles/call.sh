# s06 call 5 (H200): block-128 FP8 at 1024-4096 tokens, both GEMMs forced onto the other blockwise tiles (2x1 clusters
# multicasting the weight tile; pingpong 64x128 alone and in 2x1 clusters) beside the plan's coop 128x128 and bf16.
source .device_carry/s06/go.sh
V="ours"
for t in coop128x128c2 pingpong64x128 pingpong64x128c2; do V="$V,ours:gemm1_tactic=wgmma:$t:plain:plain+gemm2_tactic=wgmma:$t:plain:evict_last"; done
timeout 560 python3 -m moe_build bench --quant fp8_block --tokens 1024,2048,4096 --iters 5 --input-sets 2 --variants "$V,ours_bf16" --json $OUT/bench_block_tiles.json > $OUT/bench_block_tiles.log 2>&1; echo "bench rc=$?"
grep -A60 "^quant " $OUT/bench_block_tiles.log | cut -c1-200 | head -70
