# s30 call 3: the final library (the token digits with each row's dynamic scale, the FC2 fusion at every count):
# the digits and dequantized kernels against their references, the W4AFP8 runner file and the weight-only runner's
# digits / finalize cases against fp64, then the W4AFP8 bench with per-row scales (default variants: every fusion
# forced off) and the static-scale layers at 1 and 16 tokens beside bf16.
timeout 120 python -m pytest -q tests/gpu/test_token_digits.py -p no:cacheprovider > $OUT/digits.log 2>&1
echo "digits rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/digits.log | tail -4
timeout 120 python -m pytest -q tests/gpu/test_fp8_quantize.py -k "dequantized" -p no:cacheprovider > $OUT/quantize.log 2>&1
echo "quantize rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/quantize.log | tail -4
timeout 150 python -m pytest -q tests/gpu/test_runner_w4afp8.py -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -6
timeout 120 python -m pytest -q tests/gpu/test_runner_woq.py -k "digits or finalize" -p no:cacheprovider > $OUT/runner_woq.log 2>&1
echo "runner_woq rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner_woq.log | tail -4
timeout 300 python -m moe_build bench --quant w4afp8_dynamic --tokens 1,16,256,4096 --iters 5 --input-sets 2 \
  --json $OUT/dyn_r1.json > $OUT/dyn.txt 2> $OUT/dyn.log
echo "dyn rc=$?"; cat $OUT/dyn.txt
timeout 100 python -m moe_build bench --quant w4afp8 --tokens 1,16 --iters 5 --input-sets 2 \
  --variants "ours,ours_bf16" --json $OUT/static_r1.json > $OUT/static.txt 2> $OUT/static.log
echo "static rc=$?"; cat $OUT/static.txt
