MOE_BUILD_KERNELS_LIB=/tmp/b/libmoe_build_kernels.so timeout 150 python -m pytest -q -x tests/gpu/test_stage_kernels.py -k "routing_prologue" -p no:cacheprovider 2>&1 | tail -2
for r in 1 2; do for lib in new b; do
  export MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so
  timeout 150 python -m moe_build bench --quant fp8 --shapes qwen3-30b-a3b,deepseek-v3,gpt-oss-20b --tokens 1,4,8 --iters 20 --variants ours --json $OUT/fp8${lib}_r$r.json > /dev/null 2>&1
  timeout 120 python -m moe_build bench --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,4,8 --iters 20 --variants ours --json $OUT/woq${lib}_r$r.json > /dev/null 2>&1
  timeout 120 python -m moe_build bench --shapes qwen3-30b-a3b,mixtral-8x7b --tokens 1,4,16 --iters 20 --variants ours --json $OUT/bf16${lib}_r$r.json > /dev/null 2>&1
done; done
python .device_carry/s25/ab.py $OUT
