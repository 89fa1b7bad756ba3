# s24 call 3: group 64's groups a wait on the digits tile, 4 / 3 (lib_b) against 3 / 2 (lib_new) at one / more mmas a
# step: GPT-OSS-20B W4A16, the plan and both GEMMs forced onto the digits tile, 1-16 tokens, two rounds interleaved;
# then the GEMMs alone on each library (probe).
D1=decode:digits_ksplit1:after_trigger:plain; D2=decode:digits_ksplit2:after_trigger:plain
V="ours,ours:gemm1_tactic=$D1+gemm2_tactic=$D2,ours:gemm1_tactic=$D1+gemm2_tactic=$D1"
for r in 1 2; do
  for lib in new b; do
    MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so timeout 120 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes gpt-oss-20b --tokens 1,4,8,16 --variants "$V" --json $OUT/nb_${lib}_r$r.json > $OUT/nb_${lib}_r$r.log 2>&1; echo "$lib r$r rc=$?"
  done
done
for lib in new b; do
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so WOQ_DIGITS_GEMMS=gptoss_g1,gptoss_g2 WOQ_DIGITS_TOKENS=1,4,16 WOQ_DIGITS_KSPLITS=1 timeout 100 python bench/woq_digits_probe.py > $OUT/probe_$lib.log 2>&1; echo "probe $lib rc=$?"
  mv $OUT/woq_digits_probe.json $OUT/probe_$lib.json
done
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_woq_gemm.py -k "digits" > $OUT/gpu_tests_b.log 2>&1; echo "tests (lib $LIB) rc=$?"; tail -n 1 $OUT/gpu_tests_b.log
python .device_carry/s24/ab.py $OUT
for lib in new b; do echo $lib; sed -n '/^gemm  /,/^$/p' $OUT/probe_$lib.log; done
