# s07 call 8 (H200): the FP8 runner against fp64 on this tree's plans (the short-K finalize GEMM2 on pingpong64x128c2
# from 2 to 48 rows an expert); the whole FP8 runner file.
source .device_carry/s07/go.sh
timeout 300 python3 -m pytest -q tests/gpu/test_runner_fp8.py -p no:cacheprovider > $OUT/gpu_tests_runner_fp8.log 2>&1; echo "rc=$?"
tail -5 $OUT/gpu_tests_runner_fp8.log
