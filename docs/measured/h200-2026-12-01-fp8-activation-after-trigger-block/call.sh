MOE_BUILD_KERNELS_LIB=/tmp/x/libmoe_build_kernels.so timeout 100 python -m pytest -q -x tests/gpu/test_stage_kernels.py tests/gpu/test_fp8_quantize.py -k "activation" -p no:cacheprovider 2>&1 | tail -2
for r in 1 2; do for lib in x b; do
  export MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so
  timeout 100 python -m moe_build bench --quant fp8_block --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,2,4,8,16 --iters 20 --variants ours --json $OUT/blk${lib}_r$r.json > /dev/null 2>&1
  timeout 80 python -m moe_build bench --quant w4afp8 --shapes qwen3-30b-a3b,gpt-oss-20b --tokens 1,4,16 --iters 20 --variants ours --json $OUT/w4f${lib}_r$r.json > /dev/null 2>&1
done; done
python .device_carry/s25/ab.py $OUT
