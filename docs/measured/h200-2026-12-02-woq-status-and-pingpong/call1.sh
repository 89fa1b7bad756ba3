# s32 call 1: the s31 plans on the GPU (runner W4A16/W8A16 on the new tile heights, W4AFP8, the FP8 quantize kernels
# after bc098ed); WFP4A16's bench points (the targets table lacks its row); the W4A16 token sweep beside bf16; the
# mixed-input GEMM's rate on whole tiles beside bf16 (diagnosis) and ncu on it.
t0=$SECONDS
timeout 170 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py \
  -k "many_tokens or 320 or sizes or top_k or expert_counts" > $OUT/runner_woq.log 2>&1
echo "runner_woq rc=$? $((SECONDS-t0))s"; tail -1 $OUT/runner_woq.log
t0=$SECONDS
timeout 170 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner_w4afp8.py tests/gpu/test_fp8_quantize.py \
  -k "not test_fp8_quantize or dequantized" > $OUT/w4afp8.log 2>&1
echo "w4afp8+quantize rc=$? $((SECONDS-t0))s"; tail -1 $OUT/w4afp8.log
t0=$SECONDS
timeout 100 python docs/measured/h200-2026-12-02-woq-status-and-pingpong/mixed_rate.py time > $OUT/mixed_rate.txt 2>&1
echo "mixed_rate rc=$? $((SECONDS-t0))s"
t0=$SECONDS
for v in int4_woq128x256 bf16_pingpong64x256c2; do
  timeout 60 ncu --clock-control none --kernel-name regex:device_kernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section Occupancy \
    python docs/measured/h200-2026-12-02-woq-status-and-pingpong/mixed_rate.py $v > $OUT/ncu_$v.txt 2>&1
  echo "ncu $v rc=$?"
done
echo "ncu $((SECONDS-t0))s"
cat $OUT/mixed_rate.txt
for v in int4_woq128x256 bf16_pingpong64x256c2; do
  echo "== $v"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|Stall|Achieved Occupancy|No Eligible" $OUT/ncu_$v.txt | head -14
done
cuobjdump -sass $MOE_BUILD_KERNELS_LIB 2>/dev/null | python docs/measured/h200-2026-12-02-woq-status-and-pingpong/sass_mix.py > $OUT/sass_mix.txt 2>&1
head -c 3000 $OUT/sass_mix.txt
