# s08 call 4 (H200): where DeepSeek-V3's 1-token routing prologue spends its time, instruction by instruction (Nsight
# Compute's source page, SASS with its warp-stall samples), on the library of branch grouped-routing-slots-experiment
# and on b475d34's.
set -u
cd "$(dirname "$0")/../.."
for l in head route; do
  mkdir -p /tmp/lib_$l
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open('.device_carry/s08/lib_$l.tar.xz')).extractall('/tmp/lib_$l')"
done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT/r
for l in route head; do
  MOE_BUILD_KERNELS_LIB=/tmp/lib_$l/libmoe_build_kernels.so timeout 120 ncu --clock-control none -k "regex:routed_maps" --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv python3 .device_carry/s08/ncu_layer.py deepseek-v3 fp8 1 > $OUT/r/ncu_src_$l.csv 2>&1
  echo "== $l rc=$?"; wc -l $OUT/r/ncu_src_$l.csv
done
head -3 $OUT/r/ncu_src_route.csv | cut -c1-600
