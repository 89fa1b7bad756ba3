# s29 call 3: the final library (W4AFP8 with a static scale on W4A16's GEMMs, the digits kernels quantizing too): the
# dequantized kernels and digits bit for bit, the token digits of W4A16 as before, the W4AFP8 runner against fp64;
# then the whole W4AFP8 bench (1-4096 tokens, every forced-off fusion, bf16 beside).
timeout 120 python -m pytest -q tests/gpu/test_fp8_quantize.py -k "dequantized" -p no:cacheprovider > $OUT/quantize.log 2>&1
echo "quantize rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/quantize.log | tail -5
timeout 150 python -m pytest -q tests/gpu/test_token_digits.py -p no:cacheprovider > $OUT/digits.log 2>&1
echo "digits rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/digits.log | tail -5
timeout 240 python -m pytest -q tests/gpu/test_runner_w4afp8.py -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -8
timeout 330 python -m moe_build bench --quant w4afp8 --tokens 1,16,256,4096 --iters 5 --input-sets 2 --json $OUT/w4afp8final_r1.json > $OUT/w4afp8final_r1.log 2>&1; echo "bench rc=$?"
python .device_carry/s29/ab.py $OUT
