# s20 call 1: where time goes (HEAD's library): FP8 block-128 and W4A16 layers at decode, kernel by kernel; and the
# FC2 input quantization fused into the activation at 1 token (FC2_QUANT_FUSED_MIN_TOKENS) re-checked on block-128.
LAYER_STEPS_SHAPES=gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite LAYER_STEPS_TOKENS=1,16 LAYER_STEPS_QUANTS=fp8_block,fp8 \
  timeout 120 python bench/layer_steps_probe.py $OUT/steps_fp8.json > $OUT/steps_fp8.log 2>&1
LAYER_STEPS_SHAPES=mixtral-8x7b,gpt-oss-20b,qwen3-30b-a3b LAYER_STEPS_TOKENS=1,16 LAYER_STEPS_QUANTS=w4a16_awq \
  timeout 120 python bench/layer_steps_probe.py $OUT/steps_woq.json > $OUT/steps_woq.log 2>&1
timeout 200 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b \
  --tokens 1 --variants ours,ours:fc2_input_quant=fc1_activation --iters 10 --json $OUT/bench_fc2q_1tok.json > $OUT/bench_fc2q_1tok.log 2>&1
grep -v Warning $OUT/steps_fp8.log | grep -v warn_once | head -80
grep -v Warning $OUT/steps_woq.log | grep -v warn_once | head -60
tail -30 $OUT/bench_fc2q_1tok.log
