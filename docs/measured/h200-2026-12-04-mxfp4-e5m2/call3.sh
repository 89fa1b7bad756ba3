# s05 call 3: the runner's weight-only GEMM operands (woq.wgmma_operand) on the int4 / int8 / W4AFP8 layers, and the
# plugin's enqueue on every weight-only mode (MXFP4 at 300 tokens through its e5m2 form), against fp64 / the runner.
source .device_carry/s05/go.sh
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_plugin_enqueue.py -k "woq" > $OUT/gpu_tests_plugin.log 2>&1
tail -n 2 $OUT/gpu_tests_plugin.log; grep -E "^FAILED" $OUT/gpu_tests_plugin.log | head -5
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py -k "not mxfp4" > $OUT/gpu_tests_runner_int.log 2>&1
tail -n 2 $OUT/gpu_tests_runner_int.log; grep -E "^FAILED" $OUT/gpu_tests_runner_int.log | head -5
timeout 160 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_w4afp8.py -x > $OUT/gpu_tests_w4afp8.log 2>&1
tail -n 2 $OUT/gpu_tests_w4afp8.log; grep -E "^FAILED" $OUT/gpu_tests_w4afp8.log | head -5
