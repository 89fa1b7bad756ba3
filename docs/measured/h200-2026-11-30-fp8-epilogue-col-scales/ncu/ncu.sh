which ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
$NCU --version
$NCU --kernel-name regex:device_kernel --launch-skip 4 --launch-count 8 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SchedulerStats \
  python .device_carry/s14/ncu_layers.py > $OUT/ncu_qwen3_fp8_4096.txt 2>&1
tail -5 $OUT/ncu_qwen3_fp8_4096.txt
grep -E "device_kernel|Duration|Throughput|Memory \[%\]|L2 Cache Throughput|DRAM Throughput|Compute \(SM\)|Stall|Issue Slots Busy|Achieved Occupancy|Registers Per|Shared Memory Config|No Eligible|One or More|Grid Size|Block Size" $OUT/ncu_qwen3_fp8_4096.txt | head -150
