# s26 call 3: the final rule (block-128 gated epilogue where GEMM1 is short): runner tests, A/B at 1-4 tokens, the bench
timeout 100 python -m pytest -q -x tests/gpu/test_runner_fp8.py -k "block128" -p no:cacheprovider 2>&1 | tail -2
for r in 5 6; do
timeout 120 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2,3,4 --iters 20 --variants "ours,ours:fc1_activation=separate" --json $OUT/blk_r$r.json 2>&1 | tail -1
done
python .device_carry/s26/ab.py $OUT
timeout 330 python -m moe_build bench --quant fp8_block --tokens 1,16,256,4096 --iters 10 --input-sets 2 --json $OUT/bench_fp8_block.json 2>&1 | tail -30
