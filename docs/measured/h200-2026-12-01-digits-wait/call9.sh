# s22 call 9: the two-mma body at 4 groups a wait too (lib_new) beside HEAD 63710a9 (the one-mma body only; lib_main):
# GPU tests, the probe, W4A16 layers (one round each).
NEW=/tmp/new/libmoe_build_kernels.so
MOE_BUILD_KERNELS_LIB=$NEW timeout 200 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py tests/gpu/test_token_digits.py -k "digits or int4_g128" > $OUT/tests.log 2>&1
tail -n 2 $OUT/tests.log
for lib in new main; do
  mkdir -p $OUT/probe_$lib
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=2,4,8,16,32 OUT=$OUT/probe_$lib timeout 120 python bench/woq_digits_probe.py > $OUT/probe_$lib.log 2>&1 || echo "probe $lib failed"
done
ARGS="--quant w4a16_awq --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite --tokens 2,4,8,16,32 --variants ours --iters 20"
b() { MOE_BUILD_KERNELS_LIB=/tmp/$1/libmoe_build_kernels.so timeout 120 python -m moe_build bench $ARGS --json $OUT/bench_$1_r$2.json > $OUT/bench_$1_r$2.log 2>&1; }
b new 1; b main 1
python .device_carry/s22/ab.py $OUT
