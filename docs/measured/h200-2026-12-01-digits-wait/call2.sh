# s22 call 2: the digits kernel on per-warp cp.async rings (lib_new) beside HEAD's (lib_main): GPU tests of the
# digits tile, then the probe with each library, then W4A16 layers alternated.
NEW=/tmp/new/libmoe_build_kernels.so; MAIN=/tmp/main/libmoe_build_kernels.so
MOE_BUILD_KERNELS_LIB=$NEW timeout 200 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py -k "digits" > $OUT/tests_digits.log 2>&1
tail -3 $OUT/tests_digits.log
for lib in new main; do
  L=/tmp/$lib/libmoe_build_kernels.so
  MOE_BUILD_KERNELS_LIB=$L WOQ_DIGITS_KSPLITS=1,2,4 WOQ_DIGITS_TOKENS=1,2,4,8,16,32 OUT=$OUT/probe_$lib timeout 200 python bench/woq_digits_probe.py > $OUT/probe_$lib.log 2>&1 || echo "probe $lib failed"
done
mkdir -p $OUT/probe_new $OUT/probe_main 2>/dev/null
ARGS="--quant w4a16_awq --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2,4,8,16 --variants ours --iters 20"
b() { MOE_BUILD_KERNELS_LIB=/tmp/$1/libmoe_build_kernels.so timeout 150 python -m moe_build bench $ARGS --json $OUT/bench_$1_r$2.json > $OUT/bench_$1_r$2.log 2>&1; }
b new 1; b main 1; b main 2; b new 2
python .device_carry/s22/ab.py $OUT
