# s08 call 5 (H200): one token's grouped routing spread over the fused prologue's warps (a warp per group). The routing
# and prologue GPU tests and the runners' routing and FP8 tests against fp64 on the new library; the prologue alone
# under Nsight Compute on both libraries; DeepSeek-V3's layers at 1 token (FP8 rowwise dynamic and static, block-128),
# both libraries alternated, two rounds (bench/lib_ab.py).
set -u
cd "$(dirname "$0")/../.."
for l in head group; do
  mkdir -p /tmp/lib_$l
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open('.device_carry/s08/lib_$l.tar.xz')).extractall('/tmp/lib_$l')"
done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT/r
export MOE_BUILD_KERNELS_LIB=/tmp/lib_group/libmoe_build_kernels.so
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_stage_kernels.py -k "routing" > $OUT/r/gpu_routing.log 2>&1; echo "gpu routing rc=$?"; tail -2 $OUT/r/gpu_routing.log
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_fp8.py tests/gpu/test_runner.py -k "routing or top_k or expert_counts or every_mode" > $OUT/r/gpu_runner.log 2>&1; echo "gpu runner rc=$?"; tail -2 $OUT/r/gpu_runner.log
for l in head group; do
  MOE_BUILD_KERNELS_LIB=/tmp/lib_$l/libmoe_build_kernels.so timeout 60 ncu --clock-control none -k "regex:routed_maps" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight python3 .device_carry/s08/ncu_layer.py deepseek-v3 fp8 1 > $OUT/r/ncu_$l.txt 2>&1
  echo "== ncu $l rc=$?"; grep -E "Duration" $OUT/r/ncu_$l.txt
done
timeout 200 python3 bench/lib_ab.py --libs head=/tmp/lib_head/libmoe_build_kernels.so,group=/tmp/lib_group/libmoe_build_kernels.so \
  --rounds 2 --out $OUT/r/ab -- --quant fp8,fp8_static,fp8_block --shapes deepseek-v3 --tokens 1 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.log 2>&1; echo "ab rc=$?"; tail -6 $OUT/r/ab.log
grep -hE "^fp8" $OUT/r/ab/group_*.log | cut -c1-80
tar czf $OUT/results.tgz -C $OUT r
