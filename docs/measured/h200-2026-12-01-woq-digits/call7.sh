# s21 call 7: the digits kernel's losing case: local-memory (spill) traffic and warp stalls, NM_MAX 4 (8 rows) against
# NM_MAX 2 (4 rows) launches; spill instructions in the SASS of each instantiation.
NCU=$(command -v ncu); CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump)
M=gpu__time_duration.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio,dram__throughput.avg.pct_of_peak_sustained_elapsed
for case in "digits 3,2,1,2,0,0,0,0" "digits 2,0,0,2,0,0,0,0" "digits 1,1,1,1,1,1,1,1" "staged 3,2,1,2,0,0,0,0"; do
  set -- $case; echo "=== $1 rows $2"
  timeout 90 $NCU --clock-control none -k regex:woq_decode --launch-skip 2 --launch-count 1 --metrics $M \
    python .device_carry/s21/ncu_digits.py $1 $2 > $OUT/ncu7_${1}_${2//,/}.txt 2>&1
  grep -E "duration|local|stalled|dram|ERR|rror" $OUT/ncu7_${1}_${2//,/}.txt | sed 's/  */ /g; s/smsp__average_warp_latency_issue_stalled_//' | head -14
done
$CUOBJ -sass /tmp/new/libmoe_build_kernels.so > $OUT/lib.sass 2>/dev/null
python3 - $OUT/lib.sass <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for block in text.split("Function : ")[1:]:
    name = block.split("\n", 1)[0]
    if "woq_decode_digits_kernel" not in name or "nv_bfloat16" not in name: continue
    m = re.search(r"woq_decode_digits_kernelI13__nv_bfloat16Li(\d)ELb(\d)ELi(\d)E", name)
    stl, ldl = block.count("STL"), block.count("LDL")
    print(f"bf16 WK{m.group(1)} per_row {m.group(2)} NM_MAX {m.group(3)}: STL {stl} LDL {ldl}")
PY
