# s24 call 6 (library lib_c): Nsight Compute on the digits decode GEMM at 1 token, GPT-OSS-20B's GEMM1 (group 64,
# k 2880) and Qwen3-30B-A3B's GEMM1 (group 128, k 2048): where the warps wait.
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for g in gptoss_g1 qwen3_g1; do
  WOQ_DIGITS_GEMMS=$g WOQ_DIGITS_TOKENS=1 WOQ_DIGITS_KSPLITS=1 timeout 200 $NCU --clock-control none -k regex:woq_decode_digits --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy python bench/woq_digits_probe.py > $OUT/ncu_$g.log 2>&1; echo "$g rc=$?"
done
grep -E "Duration|Memory Throughput|DRAM Throughput|Stall|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Issued Warp|L2 Hit|Max Bandwidth|Active Warps" $OUT/ncu_*.log | head -60
