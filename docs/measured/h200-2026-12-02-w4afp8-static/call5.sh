# s29 call 5: the final library and plan (HEAD): the dequantized kernels, the token digits, the whole W4AFP8 runner
# file and the weight-only runner's digits cases against fp64.
timeout 100 python -m pytest -q tests/gpu/test_fp8_quantize.py -k "dequantized" -p no:cacheprovider > $OUT/quantize.log 2>&1
echo "quantize rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/quantize.log | tail -3
timeout 100 python -m pytest -q tests/gpu/test_token_digits.py -p no:cacheprovider > $OUT/digits.log 2>&1
echo "digits rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/digits.log | tail -3
timeout 200 python -m pytest -q tests/gpu/test_runner_w4afp8.py -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -5
timeout 150 python -m pytest -q tests/gpu/test_runner_woq.py -k "digits" -p no:cacheprovider > $OUT/runner_woq.log 2>&1
echo "runner_woq rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner_woq.log | tail -5
