# s26 call 4: the block-128 decode kernels held to two CTAs an SM (lib x) against this change's library (new)
MOE_BUILD_KERNELS_LIB=/tmp/x/libmoe_build_kernels.so timeout 120 python -m pytest -q -x tests/gpu/test_fp8_gemm.py tests/gpu/test_fp8_gemm_gated.py tests/gpu/test_fp8_quantizing_gemm.py -k "decode and (block or BLOCK) or block128" -p no:cacheprovider 2>&1 | tail -2
for r in 1 2; do for lib in new x; do
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so timeout 150 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,deepseek-v3 --tokens 1,2,4,8,16 --iters 20 --variants ours --json $OUT/blk${lib}_r$r.json > /dev/null 2>&1
done; done
python .device_carry/s26/ab.py $OUT
