# s23 call 8 (HEAD d938a53, library of 83ea923): W8A16 and WFP4A16 past the decode band (8 rows per expert), the
# decode kernel forced on both GEMMs beside the plan (wgmma / mma tiles there), one round.
D=decode:ksplit1:after_trigger:plain
V="ours,ours:gemm1_tactic=$D+gemm2_tactic=$D"
for q in w8a16 wfp4a16; do
  timeout 150 python -m moe_build bench --quant $q --iters 20 --shapes qwen3-30b-a3b --tokens 144,192 --variants "$V" --json $OUT/band3_${q}_qwen3_r1.json > $OUT/band3_${q}_qwen3_r1.log 2>&1; echo "$q qwen3 rc=$?"
  timeout 150 python -m moe_build bench --quant $q --iters 20 --shapes deepseek-v2-lite --tokens 96,128 --variants "$V" --json $OUT/band3_${q}_dsv2_r1.json > $OUT/band3_${q}_dsv2_r1.log 2>&1; echo "$q dsv2 rc=$?"
done
python .device_carry/s23/ab8.py $OUT
