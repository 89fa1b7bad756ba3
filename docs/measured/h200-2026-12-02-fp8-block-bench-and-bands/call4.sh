# s27 call 4: the whole block-128 bench on HEAD's library (its first run since the twocta decode tile)
timeout 400 python -m moe_build bench --quant fp8_block --tokens 1,16,256,4096 --iters 10 --input-sets 2 --json $OUT/bench_fp8_block.json > $OUT/bench_fp8_block.log 2>&1
grep -A40 "^quant " $OUT/bench_fp8_block.log | tail -32
