# s10 call 5 (H200): stall reasons (Nsight Compute) of Qwen3-30B-A3B's digits GEMM1 at 16 tokens, K split 1, on main's
# library and on the ring build with four-group slots (branch digits-tma-ring-experiment, 99da11a).
source .device_carry/s10/go.sh
mkdir -p $OUT/r
M='regex:^smsp__average_warp_latency_issue_stalled_[a-z_]+\.ratio$,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_eligible.avg.per_cycle_active,smsp__warps_active.avg.per_cycle_active'
for L in head ring4; do for S in qwen3_g1 qwen3_g2; do
  MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so timeout 120 ncu --clock-control none -k regex:woq_decode_digits --launch-skip 2 -c 1 \
    --metrics "$M" python3 docs/measured/h200-2026-12-01-digits-wait/ncu_one.py digits $S 16 1 > $OUT/r/ncu_stalls_${L}_${S}.txt 2>&1; echo "$L $S rc=$?"
done; done
for f in $OUT/r/ncu_stalls_*; do echo "== $f"; grep -E "duration|dram__|issue_active|eligible|warps_active|stalled" $f | awk '$NF+0 > 50 || /duration|dram|issue|eligible|warps_active/' | sed 's/smsp__average_warp_latency_issue_stalled_//' | cut -c1-110; done
