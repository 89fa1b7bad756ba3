# s28 call 4: the final rule (two bands) on the plan beside both GEMMs forced to 256 in the second band, then the
# weight-only bench at 256 and 4096 tokens (every fusion forced off, bf16, dequantize-then-grouped-mm).
A=wgmma:woq128x256:plain:plain
timeout 120 python -m moe_build bench --quant w4a16_awq --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite --tokens 2304,9216,6144 --iters 5 --input-sets 2 --variants "ours,ours:gemm1_tactic=$A+gemm2_tactic=$A" --json $OUT/plan2_r1.json > $OUT/plan2_r1.log 2>&1; echo "plan2 rc=$?"
python .device_carry/s28/ab.py $OUT
for q in w4a16_awq w8a16; do
timeout 200 python -m moe_build bench --quant $q --tokens 256,4096 --iters 5 --input-sets 2 --json $OUT/bench_${q}.json > $OUT/bench_${q}.log 2>&1; echo "$q rc=$?"
grep -A10 "^quant " $OUT/bench_${q}.log | tail -9
done
