# s24 call 8 (library lib_c, HEAD's): GPT-OSS-20B W4A16 at 4-12 tokens (avg rows per expert 0.5-1.5), the plan (the
# staged tile from 4 tokens) beside both GEMMs forced onto the digits tile at the plan's K split (1), two rounds.
D1=decode:digits_ksplit1:after_trigger:plain
for r in 1 2; do
  timeout 150 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes gpt-oss-20b --tokens 4,5,6,7,8,10,12 --variants "ours,ours:gemm1_tactic=$D1+gemm2_tactic=$D1" --json $OUT/one_r$r.json > $OUT/one_r$r.log 2>&1; echo "r$r rc=$?"
done
python .device_carry/s24/ab.py $OUT
