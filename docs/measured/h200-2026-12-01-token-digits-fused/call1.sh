# s23 call 1: the token digits made by the expansion and the activation (token_digits=fused; lib_new = HEAD's tree):
# GPU tests, then the W4A16 layers with the default plan beside token_digits=separate (same process), two rounds,
# and the layer's kernels at 1 and 16 tokens.
timeout 240 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_token_digits.py tests/gpu/test_runner_woq.py -k "digits or every_mode_and_fusion or top_k or all_activations" > $OUT/tests.log 2>&1
tail -n 3 $OUT/tests.log
ARGS="--quant w4a16_awq --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2,4,8,16,32 --variants ours,ours:token_digits=separate --iters 20"
for r in 1 2; do timeout 150 python -m moe_build bench $ARGS --json $OUT/bench_r$r.json > $OUT/bench_r$r.log 2>&1; echo "bench r$r rc=$?"; done
(cd bench && LAYER_STEPS_SHAPES=mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite LAYER_STEPS_TOKENS=1,16 LAYER_STEPS_QUANTS=w4a16_awq timeout 120 python layer_steps_probe.py $OUT/layer_steps_w4a16.json > $OUT/layer_steps_w4a16.log 2>&1; echo "steps rc=$?")
python .device_carry/s23/ab.py $OUT
grep -v "^\s*$" $OUT/layer_steps_w4a16.log | grep -v Warn | cut -c1-110 | tail -n 45
