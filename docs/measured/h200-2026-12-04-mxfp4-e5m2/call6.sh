# s05 call 6: int8 (W8A16) at 4-12 rows an expert: the plan (the decode kernel to 8 rows) beside both GEMMs forced onto
# the mixed-input 32-row tile.
source .device_carry/s05/go.sh
X=wgmma:woq128x32:plain:plain
timeout 340 python3 -m moe_build bench --quant w8a16 --tokens 24,28,32,48,56,64,96,112,128 --iters 5 --input-sets 2 --json $OUT/bench_w8_band.json \
  --variants "ours,ours:gemm1_tactic=$X+gemm2_tactic=$X" > $OUT/bench_w8_band.log 2>&1
grep -A45 "^quant " $OUT/bench_w8_band.log | cut -c1-150
