# s08 call 8 (H200): the quantizing FP8 decode GEMM2 computing two column blocks a CTA, its chunk's rows quantized
# once for both (half the CTAs), on every shape where the plan runs it (1-2 tokens). Its GPU tests and the FP8
# runner's against fp64; the layers, both libraries alternated, two rounds (bench/lib_ab.py).
set -u
cd "$(dirname "$0")/../.."
for l in head cb2; do
  mkdir -p /tmp/lib_$l
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open('.device_carry/s08/lib_$l.tar.xz')).extractall('/tmp/lib_$l')"
done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT/r
export MOE_BUILD_KERNELS_LIB=/tmp/lib_cb2/libmoe_build_kernels.so
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_fp8_quantizing_gemm.py > $OUT/r/gpu_quantizing.log 2>&1; echo "gpu quantizing rc=$?"; tail -2 $OUT/r/gpu_quantizing.log
timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_runner_fp8.py -k "gated_epilogue_where_planned or gemm2_quantizing or block128_gated" > $OUT/r/gpu_runner.log 2>&1; echo "gpu runner rc=$?"; tail -2 $OUT/r/gpu_runner.log
timeout 240 python3 bench/lib_ab.py --libs head=/tmp/lib_head/libmoe_build_kernels.so,cb2=/tmp/lib_cb2/libmoe_build_kernels.so \
  --rounds 2 --out $OUT/r/ab -- --quant fp8,fp8_block --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,deepseek-v3 --tokens 1,2 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.log 2>&1; echo "ab rc=$?"; grep -E "^fp8|over the" $OUT/r/ab.log
tar czf $OUT/results.tgz -C $OUT r
