# s05 call 1: MXFP4's e5m2 form on the mixed-input kernel: its kernel tests (store, gated, finalize) and the int4 /
# int8 ones beside them, the WFP4A16 runner against fp64, then WFP4A16 layers on the new plan beside the old one
# (mma tiles / the dequantized 16-bit GEMM, activation kernel) and the bf16 layer.
source .device_carry/s05/go.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_woq_wgmma.py tests/gpu/test_woq_wgmma_gated.py tests/gpu/test_woq_wgmma_finalize.py -k "mxfp4" > $OUT/gpu_tests_e5m2.log 2>&1
tail -n 2 $OUT/gpu_tests_e5m2.log; grep -E "^FAILED" $OUT/gpu_tests_e5m2.log | head -5
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py -k "mxfp4" > $OUT/gpu_tests_runner.log 2>&1
tail -n 2 $OUT/gpu_tests_runner.log; grep -E "^FAILED" $OUT/gpu_tests_runner.log | head -5
M=mma:64x128:plain:plain; W=wgmma:pingpong64x256c2:plain:plain
timeout 300 python3 -m moe_build bench --quant wfp4a16 --tokens 256,1024,4096 --iters 5 --input-sets 2 --json $OUT/bench_e5m2.json \
  --variants "ours,ours:gemm1_tactic=$M+gemm2_tactic=$M+fc1_activation=separate,ours:gemm1_tactic=$W+gemm2_tactic=$W+fc1_activation=separate,ours_bf16" > $OUT/bench_e5m2.log 2>&1
grep -A40 "^quant " $OUT/bench_e5m2.log | cut -c1-400
X=wgmma:woq128x32:plain:plain
timeout 150 python3 -m moe_build bench --quant wfp4a16 --tokens 72,96,144,192 --iters 5 --input-sets 2 --json $OUT/bench_band.json \
  --variants "ours,ours:gemm1_tactic=$X+gemm2_tactic=$X" > $OUT/bench_band.log 2>&1
grep -A30 "^quant " $OUT/bench_band.log | cut -c1-300
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_woq_wgmma.py tests/gpu/test_woq_wgmma_gated.py tests/gpu/test_woq_wgmma_finalize.py -k "not mxfp4" > $OUT/gpu_tests_wgmma.log 2>&1
tail -n 2 $OUT/gpu_tests_wgmma.log; grep -E "^FAILED" $OUT/gpu_tests_wgmma.log | head -5
