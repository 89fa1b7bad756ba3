# s24 call 1 (library lib_new: the digits tile at group 64 with a half group at K's end): the GPU tests of the digits
# writers, the GEMM and the runner; then GPT-OSS-20B W4A16 (group 64) at 1-32 tokens, the plan beside both GEMMs
# forced onto the staged and the digits tiles; then group-128 layers on the new library beside the old (main).
timeout 330 python -m pytest -q -p no:cacheprovider tests/gpu/test_token_digits.py tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py -k "digits or decode_tile or staged" > $OUT/gpu_tests.log 2>&1
echo "tests rc=$?"; tail -n 3 $OUT/gpu_tests.log; grep -E "^FAILED|Error" $OUT/gpu_tests.log | head -20
S1=decode:staged_ksplit1:after_trigger:plain; S2=decode:staged_ksplit2:after_trigger:plain
D1=decode:digits_ksplit1:after_trigger:plain; D2=decode:digits_ksplit2:after_trigger:plain
V="ours,ours:gemm1_tactic=$S1+gemm2_tactic=$S2,ours:gemm1_tactic=$S1+gemm2_tactic=$S1,ours:gemm1_tactic=$D1+gemm2_tactic=$D2,ours:gemm1_tactic=$D1+gemm2_tactic=$D1"
timeout 150 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes gpt-oss-20b --tokens 1,4,8,16,24,32 --variants "$V" --json $OUT/g64_r1.json > $OUT/g64_r1.log 2>&1; echo "g64 rc=$?"
for r in 1 2; do
  for lib in new main; do
    MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so timeout 100 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,16 --variants ours --json $OUT/g128_${lib}_r$r.json > $OUT/g128_${lib}_r$r.log 2>&1; echo "g128 $lib r$r rc=$?"
  done
done
python .device_carry/s24/ab.py $OUT
