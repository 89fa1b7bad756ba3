# s28 call 2: the library with woq128x320c2's even-tile gate and the planner's band: kernel tests (odd counts refused),
# the band's edges (W4A16, plan beside both GEMMs forced to 256 and to 320c2), then W4A16 / W8A16 at 4096 tokens beside bf16.
timeout 150 python -m pytest -q tests/gpu/test_woq_wgmma.py -k "woq128x320c2 or refusals" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/tests.log | tail -8
A=wgmma:woq128x256:plain:plain; W=wgmma:woq128x320c2:plain:plain
V="ours,ours:finalize=separate+gemm1_tactic=$A+gemm2_tactic=$A,ours:finalize=separate+gemm1_tactic=$W+gemm2_tactic=$W"
timeout 150 python -m moe_build bench --quant w4a16_awq --shapes qwen3-30b-a3b --tokens 3584,3840,3856,4352,4864,5120,5376 --iters 5 --input-sets 2 --variants "$V" --json $OUT/bandq_r1.json > $OUT/bandq_r1.log 2>&1; echo "bandq rc=$?"
timeout 150 python -m moe_build bench --quant w4a16_awq --shapes mixtral-8x7b --tokens 896,960,1088,1216,1280,1344 --iters 5 --input-sets 2 --variants "$V" --json $OUT/bandm_r1.json > $OUT/bandm_r1.log 2>&1; echo "bandm rc=$?"
timeout 60 python -m moe_build bench --quant w4a16_awq --shapes deepseek-v2-lite --tokens 2731,3413 --iters 5 --input-sets 2 --variants "$V" --json $OUT/bandd_r1.json > $OUT/bandd_r1.log 2>&1; echo "bandd rc=$?"
for q in w4a16_awq w8a16; do
timeout 150 python -m moe_build bench --quant $q --tokens 1024,4096 --iters 5 --input-sets 2 --variants "ours,ours_bf16" --json $OUT/${q}_t4096.json > $OUT/${q}_t4096.log 2>&1; echo "$q rc=$?"
grep -B2 -A12 "^quant " $OUT/${q}_t4096.log | tail -14
done
python .device_carry/s28/ab.py $OUT
