# s26 call 1: the block-128 gated decode GEMM1 and quantizing GEMM2: kernel tests, runner tests, then the layer A/B
timeout 260 python -m pytest -q -x tests/gpu/test_fp8_quantizing_gemm.py tests/gpu/test_fp8_gemm_gated.py -k "decode or quantizing or refus" -p no:cacheprovider 2>&1 | tail -4
timeout 150 python -m pytest -q -x tests/gpu/test_runner_fp8.py -k "block128 or gated_epilogue_where or quantizing" -p no:cacheprovider 2>&1 | tail -4
for r in 1 2; do
timeout 150 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,deepseek-v3 --tokens 1,2,4,8,16 --iters 20 --variants "ours,ours:fc1_activation=separate" --json $OUT/blk_r$r.json 2>&1 | tail -2
done
python .device_carry/s26/ab.py $OUT
