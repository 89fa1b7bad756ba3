# s27 call 1: the s26 review commit's C++ on the GPU (block-128 quantizing / gated decode kernels, runner), then
# block-128 decode kernel (twocta) past its 64-row band against the plan's wgmma tiles, 8-48 tokens.
timeout 150 python -m pytest -q tests/gpu/test_fp8_quantizing_gemm.py tests/gpu/test_fp8_gemm_gated.py -k "block" -p no:cacheprovider 2>&1 | tail -4
timeout 100 python -m pytest -q tests/gpu/test_runner_fp8.py -k "block128" -p no:cacheprovider 2>&1 | tail -4
D=decode:twocta_ksplit1:after_trigger:plain
timeout 200 python -m moe_build bench --quant fp8_block --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 8,12,16,24,32,48 --iters 20 --variants "ours,ours:gemm1_tactic=$D+gemm2_tactic=$D,ours:gemm1_tactic=$D,ours:gemm2_tactic=$D" --json $OUT/band_r1.json > $OUT/band_r1.log 2>&1
timeout 100 python -m moe_build bench --quant fp8_block --shapes deepseek-v3 --tokens 8,16 --iters 20 --variants "ours,ours:gemm1_tactic=$D+gemm2_tactic=$D" --json $OUT/dsv3_r1.json > $OUT/dsv3_r1.log 2>&1
python .device_carry/s27/ab.py $OUT
