# s24 call 4 (library lib_new, the commit's tree): the weight-only GPU suites whole (runner, checkpoints, W4AFP8, the
# GEMM kernels, the digits writers), the stage kernels and the plugin's enqueue.
timeout 560 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py tests/gpu/test_runner_woq_checkpoints.py tests/gpu/test_runner_w4afp8.py tests/gpu/test_woq_gemm.py tests/gpu/test_token_digits.py tests/gpu/test_stage_kernels.py tests/gpu/test_plugin_enqueue.py > $OUT/gpu_tests_all.log 2>&1
echo "tests rc=$?"; tail -n 3 $OUT/gpu_tests_all.log; grep -E "^FAILED" $OUT/gpu_tests_all.log | head -20
