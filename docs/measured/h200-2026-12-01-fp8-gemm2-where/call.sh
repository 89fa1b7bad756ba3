# s19 call 1: where Qwen3's FP8 GEMM2 at 4096 tokens goes. ncu (if counters read), GEMM2 store vs finalize per tile,
# the bf16 layer steps for comparison.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
for epi in finalize store; do
  timeout 150 $NCU --clock-control none -k regex:device_kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
    python .device_carry/s19/ncu_one.py $epi pingpong128x128c2 > $OUT/ncu_$epi.txt 2>&1
  echo "ncu $epi rc=$?"; grep -E "Throughput|Duration|Busy|Stall|Warp Cycles|Issued|Hit Rate|Bandwidth|Eligible" $OUT/ncu_$epi.txt | head -40
done
timeout 200 python .device_carry/s19/gemm2_probe.py > $OUT/gemm2_probe.log 2>&1; echo "probe rc=$?"; cat $OUT/gemm2_probe.log | tail -32
LAYER_STEPS_SHAPES=qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b LAYER_STEPS_TOKENS=4096 LAYER_STEPS_QUANTS=bf16 timeout 60 python bench/layer_steps_probe.py $OUT/steps_bf16.json > $OUT/steps_bf16.log 2>&1; grep -v Warn $OUT/steps_bf16.log | head -40
