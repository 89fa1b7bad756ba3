# s14 call A: main's GPU tests and the README's Python example on main's library; cv's digits GEMM tests;
# W4A16 layers on head, tf, cv at 1 and 16 tokens (about 9 minutes on an H200).
source .device_carry/s11/go.sh
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
H=/tmp/head/libmoe_build_kernels.so; TF=/tmp/tf/libmoe_build_kernels.so; CV=/tmp/cv/libmoe_build_kernels.so
t0=$SECONDS; timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu tests/test_docs.py::test_the_readme_python_example_runs > $OUT/r/gpu_main.log 2>&1; echo "gpu main rc=$? $((SECONDS-t0))s"; tail -3 $OUT/r/gpu_main.log | cut -c1-300
t0=$SECONDS; MOE_BUILD_KERNELS_LIB=$CV timeout 80 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_woq_gemm.py -k "digits and not mxfp4" > $OUT/r/gpu_cv.log 2>&1; echo "gpu cv rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/gpu_cv.log | cut -c1-300
tar czf $OUT/results.tgz -C $OUT r
t0=$SECONDS; timeout 270 python3 bench/lib_ab.py --libs head=$H,tf=$TF,cv=$CV --rounds 2 --out $OUT/r/ab_woq -- --quant w4a16_awq \
  --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab_woq.log 2>&1; echo "ab woq rc=$? $((SECONDS-t0))s"
tar czf $OUT/results.tgz -C $OUT r
grep -E "passed|failed|error" $OUT/r/gpu_main.log | tail -3 | cut -c1-300
tail -9 $OUT/r/ab_woq.log | cut -c1-220
