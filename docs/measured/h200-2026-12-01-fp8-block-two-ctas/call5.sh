# s26 call 5: the twocta decode tile as a tactic (tactics.fp8_block_decode_tile_rule): kernel and runner tests, the plan
timeout 170 python -m pytest -q tests/gpu/test_fp8_gemm.py tests/gpu/test_fp8_gemm_gated.py tests/gpu/test_fp8_quantizing_gemm.py -k "twocta" -p no:cacheprovider 2>&1 | tail -2
timeout 80 python -m pytest -q tests/gpu/test_runner_fp8.py -k "block128 and (two_ctas or gated_gemm1 or fused)" -p no:cacheprovider 2>&1 | tail -2
timeout 90 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,deepseek-v3 --tokens 1,2,4,8 --iters 20 --variants ours --json $OUT/blkplan_r1.json > /dev/null 2>&1
python .device_carry/s26/ab.py $OUT
