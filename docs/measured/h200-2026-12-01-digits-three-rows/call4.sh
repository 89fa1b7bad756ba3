# s23 call 4 (HEAD 11568a5, the library of 83ea923: no kernel source changed since): the weight-only GPU suites on the
# new plans (token_digits, the digits tile to 3 rows), the plugin's enqueue, the stage kernels.
timeout 480 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py tests/gpu/test_runner_woq_checkpoints.py tests/gpu/test_plugin_enqueue.py tests/gpu/test_stage_kernels.py tests/gpu/test_token_digits.py > $OUT/gpu_tests.log 2>&1
echo "tests rc=$?"
tail -n 4 $OUT/gpu_tests.log
