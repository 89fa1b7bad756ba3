# s05 call 5: bf16 MXFP4's decode band at 7 rows an expert: the plan (the mixed-input kernel on the e5m2 form from 8 rows)
# beside both GEMMs forced onto the decode kernel (K split 1, MXFP4's tactic at 3-12 rows before), at 7 and 8 rows.
source .device_carry/s05/go.sh
D=decode:ksplit1:after_trigger:plain
timeout 200 python3 -m moe_build bench --quant wfp4a16 --tokens 28,32,56,64,75,85,112,128 --iters 5 --input-sets 2 --json $OUT/bench_edge.json \
  --variants "ours,ours:gemm1_tactic=$D+gemm2_tactic=$D" > $OUT/bench_edge.log 2>&1
grep -A40 "^quant " $OUT/bench_edge.log | cut -c1-200
