# s22 call 1: the digits tile at every K split (bench/woq_digits_probe.py), then Nsight Compute on the small-expert
# GEMMs at 16 tokens (where the CTAs are short) for the digits tile at K split 1 and 2.
WOQ_DIGITS_TOKENS=1,2,4,8,16,32 timeout 300 python bench/woq_digits_probe.py > $OUT/probe.log 2>&1
tail -45 $OUT/probe.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
for case in "digits qwen3_g1 16 1" "digits qwen3_g1 16 2" "digits qwen3_g2 16 1" "digits mixtral_g1 1 1" "digits mixtral_g1 1 2" "digits mixtral_g2 1 4" "digits mixtral_g2 1 8"; do
  set -- $case; f=$OUT/ncu_${1}_${2}_${3}tok_ks$4.txt; echo "=== $case"
  timeout 60 $NCU --clock-control none -k regex:woq_decode --launch-skip 2 --launch-count 1 --metrics $M \
    python .device_carry/s22/ncu_one.py $1 $2 $3 $4 > $f 2>&1
  grep -E "duration|dram__|warps_active|grid_size|registers|stalled|issue_active|cycles_active|rror" $f | sed 's/  */ /g; s/smsp__average_warp_latency_issue_stalled_//'
done
