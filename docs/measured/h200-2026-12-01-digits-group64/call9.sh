# s24 call 9 (library lib_c; the tree with the digits tile to 2 average rows on layers of 32-63 experts): GPT-OSS-20B
# W4A16 at 6-17 tokens, the plan beside both GEMMs forced onto the staged tile (the plan before), two rounds.
S1=decode:staged_ksplit1:after_trigger:plain
for r in 1 2; do
  timeout 150 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes gpt-oss-20b --tokens 6,12,16,17 --variants "ours,ours:gemm1_tactic=$S1+gemm2_tactic=$S1" --json $OUT/mid_r$r.json > $OUT/mid_r$r.log 2>&1; echo "r$r rc=$?"
done
python .device_carry/s24/ab.py $OUT
