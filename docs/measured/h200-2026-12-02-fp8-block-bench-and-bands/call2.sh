# s27 call 2: the mixed-input tile woq128x320 (two 160-row wgmmas a converted weight fragment): its kernel tests against
# fp64, then W4A16 / W8A16 layers at 2048-8192 tokens with both GEMMs forced onto it beside the plan.
timeout 150 python -m pytest -q tests/gpu/test_woq_wgmma.py -k "woq128x320 or refusals" -p no:cacheprovider 2>&1 | tail -4
W=wgmma:woq128x320:plain:plain
for q in w4a16_awq w8a16; do
timeout 200 python -m moe_build bench --quant $q --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b --tokens 2048,4096,8192 --iters 5 --input-sets 2 --variants "ours,ours:gemm1_tactic=$W+gemm2_tactic=$W,ours_bf16" --json $OUT/${q}_r1.json > $OUT/${q}_r1.log 2>&1
tail -3 $OUT/${q}_r1.log
done
python .device_carry/s27/ab.py $OUT
O=decode:ksplit1:after_trigger:plain
for r in 1 2; do
timeout 80 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b --tokens 3,4,5,6 --iters 20 --variants "ours,ours:gemm1_tactic=$O,ours:gemm2_tactic=$O,ours:gemm1_tactic=$O+gemm2_tactic=$O" --json $OUT/oss_r$r.json > /dev/null 2>&1
done
python .device_carry/s27/ab.py $OUT | grep "^oss"
