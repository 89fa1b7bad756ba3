# s14 call B: main's plugin enqueue tests and the README's Python example; tf's decode runner tests; FP8 rowwise and
# W4AFP8 layers on head and tf at 1 and 16 tokens.
source .device_carry/s11/go.sh
mkdir -p $OUT/r
H=/tmp/head/libmoe_build_kernels.so; TF=/tmp/tf/libmoe_build_kernels.so
t0=$SECONDS; timeout 90 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_plugin_enqueue.py tests/test_docs.py::test_the_readme_python_example_runs > $OUT/r/gpu_main.log 2>&1; echo "gpu main rc=$? $((SECONDS-t0))s"; tail -3 $OUT/r/gpu_main.log | cut -c1-300
t0=$SECONDS; MOE_BUILD_KERNELS_LIB=$TF timeout 80 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_runner_woq.py tests/gpu/test_runner_fp8.py -k "digits or top_k or decode" > $OUT/r/gpu_tf.log 2>&1; echo "gpu tf rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/gpu_tf.log | cut -c1-300
tar czf $OUT/results.tgz -C $OUT r
t0=$SECONDS; timeout 230 python3 bench/lib_ab.py --libs head=$H,tf=$TF --rounds 2 --out $OUT/r/ab_fp8 -- --quant fp8 \
  --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,deepseek-v3 --tokens 1,16 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab_fp8.log 2>&1; echo "ab fp8 rc=$? $((SECONDS-t0))s"
t0=$SECONDS; timeout 110 python3 bench/lib_ab.py --libs head=$H,tf=$TF --rounds 2 --out $OUT/r/ab_w4afp8 -- --quant w4afp8 \
  --shapes mixtral-8x7b,gpt-oss-20b --tokens 1,16 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab_w4afp8.log 2>&1; echo "ab w4afp8 rc=$? $((SECONDS-t0))s"
tar czf $OUT/results.tgz -C $OUT r
tail -12 $OUT/r/ab_fp8.log | cut -c1-200
tail -5 $OUT/r/ab_w4afp8.log | cut -c1-200
