# s27 call 3: does the woq128x320 tile run (call 2's kernel tests printed nothing in 150 s)? One small case first.
timeout 60 python -m pytest -x -q "tests/gpu/test_woq_wgmma.py::test_int8_against_fp64[dtype0-0-woq128x320]" -p no:cacheprovider > $OUT/first.log 2>&1
rc=$?; tail -5 $OUT/first.log; echo "first rc=$rc"
[ $rc -eq 0 ] || exit 0
timeout 90 python -m pytest -x -q tests/gpu/test_woq_wgmma.py -k "woq128x320" -p no:cacheprovider 2>&1 | tail -5
W=wgmma:woq128x320:plain:plain
timeout 200 python -m moe_build bench --quant w4a16_awq --shapes qwen3-30b-a3b,gpt-oss-20b,mixtral-8x7b,deepseek-v2-lite --tokens 4096,8192 --iters 5 --input-sets 2 --variants "ours,ours:finalize=separate+gemm1_tactic=$W+gemm2_tactic=$W" --json $OUT/w4b_r1.json > $OUT/w4b_r1.log 2>&1
tail -2 $OUT/w4b_r1.log
python .device_carry/s27/ab.py $OUT
