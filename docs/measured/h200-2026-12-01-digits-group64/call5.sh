# s24 call 5 (library lib_c: one group-64 row loader, gemm/loads.cuh ld_int4_batch_row, for the staged and digits
# kernels): the decode GEMM tests and the weight-only runner; GPT-OSS-20B and Qwen3-30B-A3B W4A16 at 1 and 16 tokens
# on lib_c beside lib_new (the loaders before), two rounds interleaved.
timeout 300 python -m pytest -q -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py tests/gpu/test_token_digits.py > $OUT/gpu_tests_c.log 2>&1
echo "tests rc=$?"; tail -n 1 $OUT/gpu_tests_c.log; grep -E "^FAILED" $OUT/gpu_tests_c.log | head
for r in 1 2; do
  for lib in c new; do
    MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so timeout 100 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes gpt-oss-20b,qwen3-30b-a3b --tokens 1,16 --variants ours --json $OUT/ld_${lib}_r$r.json > $OUT/ld_${lib}_r$r.log 2>&1; echo "$lib r$r rc=$?"
  done
done
python .device_carry/s24/ab.py $OUT
