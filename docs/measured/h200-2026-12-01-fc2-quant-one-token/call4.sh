# s20 call 4 (HEAD's library, this tree's planner): GPU tests of the plans that change (FP8 and W4AFP8 runners);
# the new plan at 1 token beside the old one forced; GPT-OSS-20B block-128 GEMM1 split in two at 1 token, again.
timeout 260 python -m pytest -q -p no:cacheprovider -x tests/gpu/test_runner_fp8.py > $OUT/gpu_tests_runner_fp8.log 2>&1
tail -n 2 $OUT/gpu_tests_runner_fp8.log; grep -E "^FAILED" $OUT/gpu_tests_runner_fp8.log | head -5
timeout 200 python -m pytest -q -p no:cacheprovider -x tests/gpu/test_runner_w4afp8.py > $OUT/gpu_tests_runner_w4afp8.log 2>&1
tail -n 2 $OUT/gpu_tests_runner_w4afp8.log; grep -E "^FAILED" $OUT/gpu_tests_runner_w4afp8.log | head -5
D=decode:ksplit
timeout 100 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1 \
  --variants ours,ours:fc2_input_quant=separate,ours:gemm1_tactic=${D}2:after_trigger:plain --iters 10 --json $OUT/block_1tok_plan.json > $OUT/block_1tok_plan.log 2>&1
timeout 100 python -m moe_build bench --quant w4afp8 --shapes mixtral-8x7b,gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1 \
  --variants ours,ours:fc2_prequant=separate --iters 10 --json $OUT/w4afp8_1tok_plan.json > $OUT/w4afp8_1tok_plan.log 2>&1
for f in block_1tok_plan w4afp8_1tok_plan; do grep -E "@graph|rror" $OUT/$f.log | sed 's/:after_trigger:plain//g' | head; done
