# s07 call 1 (H200): where the FP8 layers' time goes at 16 and 256 tokens (the missed floor points), kernel by kernel.
source .device_carry/s07/go.sh
LAYER_STEPS_SHAPES=qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b LAYER_STEPS_TOKENS=16,256 LAYER_STEPS_QUANTS=fp8,fp8_block \
  timeout 400 python3 bench/layer_steps_probe.py $OUT/layer_steps.json > $OUT/layer_steps.log 2>&1; echo "steps rc=$?"
grep -v "^ *$" $OUT/layer_steps.log | cut -c1-150 | tail -150
