# s30 call 2: the W4AFP8 runner file and the weight-only runner's digits / finalize cases against fp64 (after the
# finalize-argument fix), then the new library's W4AFP8 bench with per-row scales (the fusions forced off, and the FC2
# fusion forced on for the 1-token narrow-expert band), then the static-scale layers' default plan beside bf16.
timeout 150 python -m pytest -q tests/gpu/test_runner_w4afp8.py -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -6
timeout 150 python -m pytest -q tests/gpu/test_runner_woq.py -k "digits or finalize" -p no:cacheprovider > $OUT/runner_woq.log 2>&1
echo "runner_woq rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner_woq.log | tail -6
timeout 300 python -m moe_build bench --quant w4afp8_dynamic --tokens 1,16,256,4096 --iters 5 --input-sets 2 \
  --variants "ours,ours:expand_rows=plain,ours:fc2_prequant=separate,ours:fc2_prequant=fused,ours_bf16" \
  --json $OUT/newdyn_r1.json > $OUT/newdyn.txt 2> $OUT/newdyn.log
echo "newdyn rc=$?"; cat $OUT/newdyn.txt
timeout 150 python -m moe_build bench --quant w4afp8 --tokens 1,16,256,4096 --iters 5 --input-sets 2 \
  --variants "ours,ours_bf16" --json $OUT/newstatic_r1.json > $OUT/newstatic.txt 2> $OUT/newstatic.log
echo "newstatic rc=$?"; cat $OUT/newstatic.txt
