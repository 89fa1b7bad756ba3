# s28 call 5: the final library (three-step prologue workspace sized for every call up to a count): the three-step
# stage tests, the mixed-input kernel tests, the weight-only runner on the band; then Qwen3-30B-A3B W4A16 at 6144
# tokens (call 4: workspace_bytes=18576, need 24768) and the second band on the plan beside both GEMMs on 256.
timeout 120 python -m pytest -q tests/gpu/test_stage_kernels.py -k "three_step" -p no:cacheprovider > $OUT/stage.log 2>&1
echo "stage rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/stage.log | tail -5
timeout 150 python -m pytest -q tests/gpu/test_woq_wgmma.py -p no:cacheprovider > $OUT/woq_wgmma.log 2>&1
echo "woq_wgmma rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/woq_wgmma.log | tail -5
timeout 120 python -m pytest -q tests/gpu/test_runner_woq.py -k "320_row_tile_band or many_tokens" -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -5
A=wgmma:woq128x256:plain:plain
timeout 150 python -m moe_build bench --quant w4a16_awq --shapes qwen3-30b-a3b,mixtral-8x7b --tokens 2304,6144,9216 --iters 5 --input-sets 2 --variants "ours,ours:finalize=separate+gemm1_tactic=$A+gemm2_tactic=$A" --json $OUT/plan3_r1.json > $OUT/plan3_r1.log 2>&1; echo "plan3 rc=$?"
python .device_carry/s28/ab.py $OUT
