# s23 call 3 (the digits rule at 3 average rows per expert; library unchanged): the default plan across the counts it
# moves, beside both GEMMs forced onto the staged tile (the rule before: 2 rows), and past the new bound beside the
# digits tile forced, two rounds.
ARGS="--quant w4a16_awq --iters 20"
D=decode:digits_ksplit1:after_trigger:plain
S=decode:staged_ksplit1:after_trigger:plain
for r in 1 2; do
  timeout 120 python -m moe_build bench $ARGS --shapes qwen3-30b-a3b --tokens 33,40,48,56 --variants "ours,ours:gemm1_tactic=$S+gemm2_tactic=$S,ours:gemm1_tactic=$D+gemm2_tactic=$D" --json $OUT/rule_qwen3_r$r.json > $OUT/rule_qwen3_r$r.log 2>&1; echo "qwen3 r$r rc=$?"
  timeout 120 python -m moe_build bench $ARGS --shapes deepseek-v2-lite --tokens 22,27,32,37 --variants "ours,ours:gemm1_tactic=$S+gemm2_tactic=$S,ours:gemm1_tactic=$D+gemm2_tactic=$D" --json $OUT/rule_dsv2_r$r.json > $OUT/rule_dsv2_r$r.log 2>&1; echo "dsv2 r$r rc=$?"
done
python .device_carry/s23/ab3.py $OUT
