# s28 call 3: the runner on the 320-row band against fp64 (and the weight-only runner's many-token / expert-count cases),
# a second band (two 320-row tiles where 256-row tiles take three: 544-640 rows an expert), then two more rounds of
# W4A16 / W8A16 at 4096 tokens beside bf16.
timeout 240 python -m pytest -q tests/gpu/test_runner_woq.py -k "320_row_tile_band or many_tokens or expert_counts" -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -8
W=wgmma:woq128x320c2:plain:plain
V="ours,ours:finalize=separate+gemm1_tactic=$W+gemm2_tactic=$W"
timeout 150 python -m moe_build bench --quant w4a16_awq --shapes mixtral-8x7b --tokens 2176,2304,2432,2560,2688 --iters 5 --input-sets 2 --variants "$V" --json $OUT/band2m_r1.json > $OUT/band2m_r1.log 2>&1; echo "band2m rc=$?"
timeout 100 python -m moe_build bench --quant w4a16_awq --shapes qwen3-30b-a3b --tokens 9216,10240 --iters 5 --input-sets 2 --variants "$V" --json $OUT/band2q_r1.json > $OUT/band2q_r1.log 2>&1; echo "band2q rc=$?"
python .device_carry/s28/ab.py $OUT
for r in 2 3; do for q in w4a16_awq w8a16; do
timeout 120 python -m moe_build bench --quant $q --tokens 4096 --iters 5 --input-sets 2 --variants "ours,ours_bf16" --json $OUT/${q}_4096_x$r.json > $OUT/${q}_4096_x$r.log 2>&1; echo "$q x$r rc=$?"
grep -A6 "^quant " $OUT/${q}_4096_x$r.log | tail -4
done; done
