for r in 3 4 5; do for lib in b new; do
  export MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so
  timeout 100 python -m moe_build bench --quant fp8 --shapes gpt-oss-20b,qwen3-30b-a3b --tokens 1 --iters 30 --variants ours --json $OUT/fp8${lib}_r$r.json > /dev/null 2>&1
done; done
python .device_carry/s25/ab.py $OUT
