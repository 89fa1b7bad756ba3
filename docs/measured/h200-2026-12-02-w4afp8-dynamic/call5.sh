# s30 call 5: per-row-scaled W4AFP8 at decode on the narrow-expert layers: the plan (digits tile, token digits by
# steps) beside both GEMMs forced onto the staged 16-bit decode tile (no digits steps), k_split 2 and 1.
S2="ours:gemm1_tactic=decode:staged_ksplit2:after_trigger:plain+gemm2_tactic=decode:staged_ksplit2:after_trigger:plain"
S1="ours:gemm1_tactic=decode:staged_ksplit1:after_trigger:plain+gemm2_tactic=decode:staged_ksplit1:after_trigger:plain"
for r in 1 2; do
timeout 200 python -m moe_build bench --quant w4afp8_dynamic --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2,4,16 \
  --iters 5 --input-sets 2 --variants "ours,$S2,$S1" --json $OUT/staged_r$r.json > $OUT/staged_r$r.txt 2> $OUT/staged_r$r.log
echo "staged r$r rc=$?"; cat $OUT/staged_r$r.txt
done
