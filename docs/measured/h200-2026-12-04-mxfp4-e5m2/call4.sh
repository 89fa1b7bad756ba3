# s05 call 4: WFP4A16 on the final plan (MXFP4's decode band 8 rows, the mixed-input kernel on its e5m2 form past it)
# beside the bf16 layer: a second round of the bench points from 256 tokens, and the counts around the band's edge.
source .device_carry/s05/go.sh
timeout 300 python3 -m moe_build bench --quant wfp4a16 --tokens 64,72,96,128,256,1024,2048,4096 --iters 5 --input-sets 2 --json $OUT/bench_final.json \
  --variants "ours,ours_bf16" > $OUT/bench_final.log 2>&1
grep -A40 "^quant " $OUT/bench_final.log | cut -c1-120
