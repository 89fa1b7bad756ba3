timeout 120 python -m pytest -q tests/gpu/test_stage_kernels.py -k "routing" -p no:cacheprovider 2>&1 | tail -2
G2='ours:gemm2_tactic=decode:ksplit2:after_trigger:plain'
G1='ours:gemm1_tactic=decode:ksplit2:after_trigger:plain'
B='ours:gemm1_tactic=decode:ksplit2:after_trigger:plain+gemm2_tactic=decode:ksplit2:after_trigger:plain'
for r in 1 2; do
timeout 200 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b,deepseek-v2-lite,qwen3-30b-a3b --tokens 1,2,4,8 --iters 20 --variants "ours,$G2,$G1,$B" --json $OUT/blk_r$r.json 2>&1 | tail -3
done
python .device_carry/s25/ab.py $OUT
