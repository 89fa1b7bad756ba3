# s08 call 3 (H200): grouped routing on keys held in registers where groups are whole 32-key slots (DeepSeek-V3).
# The routing and prologue kernels' GPU tests, and the FP8 runner's routing methods, against fp64 on the new library;
# the routing prologue alone under Nsight Compute on both libraries; DeepSeek-V3 layers (FP8 rowwise dynamic and
# static) at 1 and 16 tokens, both libraries alternated, two rounds (bench/lib_ab.py).
set -u
cd "$(dirname "$0")/../.."
for l in head route; do
  mkdir -p /tmp/lib_$l
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open('.device_carry/s08/lib_$l.tar.xz')).extractall('/tmp/lib_$l')"
done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT/r
export MOE_BUILD_KERNELS_LIB=/tmp/lib_route/libmoe_build_kernels.so
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_stage_kernels.py -k "routing" > $OUT/r/gpu_routing.log 2>&1; echo "gpu routing rc=$?"; tail -2 $OUT/r/gpu_routing.log
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_fp8.py tests/gpu/test_runner.py -k "routing" > $OUT/r/gpu_runner.log 2>&1; echo "gpu runner rc=$?"; tail -2 $OUT/r/gpu_runner.log
for l in head route; do
  MOE_BUILD_KERNELS_LIB=/tmp/lib_$l/libmoe_build_kernels.so timeout 60 ncu --clock-control none -k "regex:routed_maps" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight python3 .device_carry/s08/ncu_layer.py deepseek-v3 fp8 1 > $OUT/r/ncu_$l.txt 2>&1
  echo "== ncu $l rc=$?"; grep -E "Duration|Elapsed Cycles" $OUT/r/ncu_$l.txt
done
timeout 230 python3 bench/lib_ab.py --libs head=/tmp/lib_head/libmoe_build_kernels.so,route=/tmp/lib_route/libmoe_build_kernels.so \
  --rounds 2 --out $OUT/r/ab -- --quant fp8,fp8_static --shapes deepseek-v3 --tokens 1,16 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.log 2>&1; echo "ab rc=$?"; tail -12 $OUT/r/ab.log
tar czf $OUT/results.tgz -C $OUT r
