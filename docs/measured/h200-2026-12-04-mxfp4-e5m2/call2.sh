# s05 call 2: 8-bit weights (MXFP4's e5m2 form, int8) on the mixed-input tiles at 16-64 rows an expert: each GEMM pair
# forced onto the 32-, 64- and 128-row token tiles beside the plan (the tile rule was fitted on int4), and the plan's
# new MXFP4 decode band (8 rows) at its edges.
source .device_carry/s05/go.sh
T=plain:plain
timeout 330 python3 -m moe_build bench --quant wfp4a16,w8a16 --tokens 128,256,512 --iters 5 --input-sets 2 --json $OUT/bench_tiles.json \
  --variants "ours,ours:gemm1_tactic=wgmma:woq128x32:$T+gemm2_tactic=wgmma:woq128x32:$T,ours:gemm1_tactic=wgmma:woq128x64:$T+gemm2_tactic=wgmma:woq128x64:$T,ours:gemm1_tactic=wgmma:woq128x128:$T+gemm2_tactic=wgmma:woq128x128:$T,ours_bf16" > $OUT/bench_tiles.log 2>&1
grep -A30 "^quant " $OUT/bench_tiles.log | cut -c1-330
