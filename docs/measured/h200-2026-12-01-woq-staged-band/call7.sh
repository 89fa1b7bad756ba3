# s23 call 7 (HEAD 0692ce8: the staged int4 tile to 12 rows; library of 83ea923): the weight-only runner GPU tests.
timeout 300 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py tests/gpu/test_plugin_enqueue.py > $OUT/gpu_tests.log 2>&1
echo "tests rc=$?"
tail -n 3 $OUT/gpu_tests.log
