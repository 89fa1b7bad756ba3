# s23 call 10 (HEAD with MXFP4's decode band to 12 rows; library of 83ea923): the weight-only runner GPU tests.
timeout 240 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py > $OUT/gpu_tests_mxfp4.log 2>&1
echo "tests rc=$?"
tail -n 2 $OUT/gpu_tests_mxfp4.log
