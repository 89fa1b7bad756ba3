# s21 call 6: what bounds the digits tile where it loses (Mixtral-8x7B GEMM1, chunks of 2-3 rows) beside where it wins
# (one row a chunk), and the staged tile on the same rows: ncu pipe and issue counters.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
M=sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__warps_active.avg.per_cycle_active,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
for case in "digits 1,0,0,1,0,0,0,0" "staged 1,0,0,1,0,0,0,0" "digits 3,2,1,2,0,0,0,0" "staged 3,2,1,2,0,0,0,0"; do
  set -- $case
  echo "=== $1 rows $2"
  timeout 90 $NCU --clock-control none -k regex:woq_decode --launch-skip 2 --launch-count 1 --metrics $M \
    python .device_carry/s21/ncu_digits.py $1 $2 > $OUT/ncu_${1}_${2//,/}.txt 2>&1
  grep -E "pipe|issue|dram|duration|inst_executed|warps_active|conflicts|ERR|rror" $OUT/ncu_${1}_${2//,/}.txt | sed 's/  */ /g' | head -14
done
