# s14 call D: main's runner tests (every quant) and the tool-written checkpoints on main's library (head = main's C++).
set -u
mkdir -p /tmp/head && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s14/head.tar.xz /tmp/head
export MOE_BUILD_KERNELS_LIB=/tmp/head/libmoe_build_kernels.so
export MOE_BUILD_FP8_TOOL_CHECKPOINTS=$PWD/.device_carry/fp8_tool_checkpoints MOE_BUILD_WOQ_TOOL_CHECKPOINTS=$PWD/.device_carry/woq_tool_checkpoints
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT
t0=$SECONDS; timeout 150 python3 -m pytest -q -rs --durations=8 -p no:cacheprovider tests/gpu/test_runner_fp8_checkpoints.py tests/gpu/test_runner_woq_checkpoints.py tests/gpu/test_runner.py tests/gpu/test_runner_woq.py > $OUT/gpu_runner1.log 2>&1; echo "runner1 rc=$? $((SECONDS-t0))s"; tail -4 $OUT/gpu_runner1.log | cut -c1-300
t0=$SECONDS; timeout 100 python3 -m pytest -q -rs --durations=8 -p no:cacheprovider tests/gpu/test_runner_fp8.py tests/gpu/test_runner_w4afp8.py tests/gpu/test_bench_timing.py > $OUT/gpu_runner2.log 2>&1; echo "runner2 rc=$? $((SECONDS-t0))s"; tail -4 $OUT/gpu_runner2.log | cut -c1-300
grep -E "FAILED|Error" $OUT/gpu_runner*.log | head -20 | cut -c1-300
