# s23 call 5 (HEAD's plans, library of 83ea923): past the decode band (8 average rows per expert) the weight-only GEMMs
# take the mixed-input wgmma tiles; the decode kernel's tiles forced there, 9-16 rows, one round (two for Qwen3/DSV2).
ARGS="--quant w4a16_awq --iters 20"
D=decode:digits_ksplit1:after_trigger:plain
S=decode:staged_ksplit1:after_trigger:plain
V="ours,ours:gemm1_tactic=$S+gemm2_tactic=$S,ours:gemm1_tactic=$D+gemm2_tactic=$D"
for r in 1 2; do
  timeout 150 python -m moe_build bench $ARGS --shapes qwen3-30b-a3b --tokens 128,144,160,192,256 --variants "$V" --json $OUT/band_qwen3_r$r.json > $OUT/band_qwen3_r$r.log 2>&1; echo "qwen3 r$r rc=$?"
  timeout 150 python -m moe_build bench $ARGS --shapes deepseek-v2-lite --tokens 85,96,107,128,171 --variants "$V" --json $OUT/band_dsv2_r$r.json > $OUT/band_dsv2_r$r.log 2>&1; echo "dsv2 r$r rc=$?"
done
timeout 150 python -m moe_build bench $ARGS --shapes mixtral-8x7b --tokens 32,36,48,64 --variants "ours,ours:gemm1_tactic=$S" --json $OUT/band_mixtral_r1.json > $OUT/band_mixtral_r1.log 2>&1; echo "mixtral rc=$?"
python .device_carry/s23/ab5.py $OUT
