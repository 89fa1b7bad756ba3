# s23 call 2 (HEAD 83ea923's library): (A) the finalize in the digits GEMM2's epilogue at 8-32 tokens of the top-6/8
# layers, where the rule keeps it separate; (B) both GEMMs on the digits tile past the rule's 2 rows per expert.
ARGS="--quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite --iters 20"
D=decode:digits_ksplit1:after_trigger:plain
for r in 1 2; do
  timeout 120 python -m moe_build bench $ARGS --tokens 8,16,32 --variants ours,ours:finalize=fused --json $OUT/fin_r$r.json > $OUT/fin_r$r.log 2>&1; echo "fin r$r rc=$?"
  timeout 120 python -m moe_build bench $ARGS --tokens 32,48,64,96 --variants "ours,ours:gemm1_tactic=$D+gemm2_tactic=$D,ours:gemm1_tactic=$D" --json $OUT/dig_r$r.json > $OUT/dig_r$r.log 2>&1; echo "dig r$r rc=$?"
done
python .device_carry/s23/ab2.py $OUT
