# s28 call 1: the mixed-input tile woq128x320c2 (320 token rows in 2x1 clusters, each CTA loading 160 rows for both):
# one small case, its kernel tests against fp64 (odd weight-tile counts included), then W4A16 / W8A16 layers at
# 1024-8192 tokens with either GEMM or both forced onto it beside the plan and the bf16 layer.
timeout 60 python -m pytest -x -q "tests/gpu/test_woq_wgmma.py::test_int8_against_fp64[dtype0-0-woq128x320c2]" -p no:cacheprovider > $OUT/first.log 2>&1
rc=$?; tail -5 $OUT/first.log; echo "first rc=$rc"
[ $rc -eq 0 ] || exit 0
timeout 150 python -m pytest -q tests/gpu/test_woq_wgmma.py -k "woq128x320c2 or refusals" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/tests.log | tail -12
W=wgmma:woq128x320c2:plain:plain
timeout 260 python -m moe_build bench --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,gpt-oss-20b --tokens 1024,2048,4096,8192 --iters 5 --input-sets 2 --variants "ours,ours:finalize=separate+gemm1_tactic=$W+gemm2_tactic=$W,ours:gemm1_tactic=$W,ours:finalize=separate+gemm2_tactic=$W,ours_bf16" --json $OUT/w4_r1.json > $OUT/w4_r1.log 2>&1
echo "w4 rc=$?"; tail -2 $OUT/w4_r1.log
timeout 150 python -m moe_build bench --quant w8a16 --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,gpt-oss-20b --tokens 4096,8192 --iters 5 --input-sets 2 --variants "ours,ours:finalize=separate+gemm1_tactic=$W+gemm2_tactic=$W,ours_bf16" --json $OUT/w8_r1.json > $OUT/w8_r1.log 2>&1
echo "w8 rc=$?"; tail -2 $OUT/w8_r1.log
python .device_carry/s28/ab.py $OUT
