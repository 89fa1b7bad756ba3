# s29 call 1: W4AFP8 (static input scales) on the mixed-input wgmma kernel: the dequantized expansion / activation
# kernels bit for bit, the runner against fp64, then the bench at 256 and 4096 tokens beside the mma tiles it ran
# before (forced) and the bf16 layer.
timeout 150 python -m pytest -q tests/gpu/test_fp8_quantize.py -k "dequantized" -p no:cacheprovider > $OUT/quantize.log 2>&1
echo "quantize rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/quantize.log | tail -5
timeout 200 python -m pytest -q tests/gpu/test_runner_w4afp8.py -k "mixed_input or bit_for_bit or many_tokens or plan_runs" -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -8
M1=mma:64x128:plain:plain; M2=mma:128x128:plain:plain
timeout 110 python -m moe_build bench --quant w4afp8 --tokens 256 --iters 5 --input-sets 2 --variants "ours,ours:finalize=separate+gemm1_tactic=$M1+gemm2_tactic=$M1,ours_bf16" --json $OUT/w4afp8_256_r1.json > $OUT/w4afp8_256_r1.log 2>&1; echo "bench256 rc=$?"
timeout 150 python -m moe_build bench --quant w4afp8 --tokens 4096 --iters 5 --input-sets 2 --variants "ours,ours:finalize=separate+gemm1_tactic=$M2+gemm2_tactic=$M2,ours_bf16" --json $OUT/w4afp8_4096_r1.json > $OUT/w4afp8_4096_r1.log 2>&1; echo "bench4096 rc=$?"
python .device_carry/s29/ab.py $OUT
