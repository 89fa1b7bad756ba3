# s04 call 1: the digits4w tile's kernel and runner tests against fp64, the SASS of every kernel beside the previous
# library's, and the layers with each GEMM forced onto digits4w beside the plan.
source .device_carry/s04/go.sh
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_woq_gemm.py -k "digits or decode_tile or weight_only_tiles or finalize" > $OUT/gpu_tests_gemm.log 2>&1
tail -n 2 $OUT/gpu_tests_gemm.log; grep -E "^FAILED" $OUT/gpu_tests_gemm.log | head -5
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runner_woq.py -k "digits_tile" > $OUT/gpu_tests_runner.log 2>&1
tail -n 2 $OUT/gpu_tests_runner.log; grep -E "^FAILED" $OUT/gpu_tests_runner.log | head -5
D=decode:digits4w_ksplit; S=:after_trigger:plain
timeout 240 python3 -m moe_build bench --quant w4a16_awq,wfp4a16 --tokens 1,4,16 --iters 8 --input-sets 2 --json $OUT/bench_4w.json \
  --variants "ours,ours:gemm1_tactic=${D}1$S,ours:gemm1_tactic=${D}2$S,ours:gemm2_tactic=${D}1$S,ours:gemm2_tactic=${D}2$S" > $OUT/bench_4w.log 2>&1
grep -A30 "^quant " $OUT/bench_4w.log | cut -c1-420
