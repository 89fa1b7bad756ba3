# s22 call 4: where the W4A16 decode layers spend their time, kernel by kernel (HEAD's library).
cd bench && LAYER_STEPS_SHAPES=mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b LAYER_STEPS_TOKENS=1,16 LAYER_STEPS_QUANTS=w4a16_awq timeout 300 python layer_steps_probe.py $OUT/layer_steps_w4a16.json > $OUT/layer_steps_w4a16.log 2>&1; echo rc=$?
cat $OUT/layer_steps_w4a16.log | cut -c1-150 | tail -n 90
