# s08 call 2 (H200, the product library of HEAD): the 1-token FP8 layers' kernels one at a time under Nsight Compute
# (DeepSeek-V3's grouped routing prologue beside Mixtral-8x7B's plain one; their stall reasons), and DeepSeek-V3 at 1
# token with GEMM1 on the decode kernel's K split 2 beside the plan's 4, three rounds.
set -u
cd "$(dirname "$0")/../.."
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('.device_carry/s08/lib_head.tar.xz')).extractall('/tmp/lib')"
export MOE_BUILD_KERNELS_LIB=/tmp/lib/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT/r
for shape in deepseek-v3 mixtral-8x7b; do
  timeout 120 ncu --clock-control none -k "regex:routed_maps|expand_rows|fp8_" --launch-skip 8 --launch-count 4 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SourceCounters \
    python3 .device_carry/s08/ncu_layer.py $shape fp8 1 > $OUT/r/ncu_$shape.txt 2>&1
  echo "== $shape rc=$?"; grep -E "^  [a-z_].*\(|Duration|Elapsed Cycles|Stall" $OUT/r/ncu_$shape.txt | head -40
done
S=:after_trigger:plain
for i in 1 2 3; do
  timeout 90 python3 -m moe_build bench --quant fp8,fp8_static --shapes deepseek-v3 --tokens 1 --iters 10 --input-sets 2 --json $OUT/r/dsv3_g1_$i.json \
    --variants "ours,ours:gemm1_tactic=decode:ksplit2$S" > $OUT/r/dsv3_g1_$i.log 2>&1; echo "dsv3 $i rc=$?"
  grep -E "T=" $OUT/r/dsv3_g1_$i.log | cut -c1-250
done
tar czf $OUT/results.tgz -C $OUT r
