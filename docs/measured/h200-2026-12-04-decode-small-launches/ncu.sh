set -u
cd "$(dirname "$0")/../.."
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('.device_carry/s03/lib.tar.xz')).extractall('/tmp/lib')"
export MOE_BUILD_KERNELS_LIB=/tmp/lib/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p $OUT
for case in "$@"; do
  set -- $case
  tag="$1_$2_$3${4:+_f}"
  timeout 150 ncu --clock-control none -k regex:woq_decode --launch-skip 6 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --metrics sm__cycles_active.min,sm__cycles_active.max,sm__warps_active.avg.pct_of_peak_sustained_active \
    python3 .device_carry/s03/ncu_layer.py $1 $2 $3 ${4:-} > $OUT/ncu_$tag.txt 2>&1
  echo "== $tag rc=$?"; grep -E "sm__cycles|woq_decode|SM Active Cycles|Elapsed Cycles|Duration|DRAM Throughput|Memory Throughput|Achieved Active Warps|Issue Slots Busy|No Eligible|Registers Per|Grid Size|Waves Per SM|Stall" $OUT/ncu_$tag.txt | head -40
done
