# s24 call 2 (library lib_new): the digits writers' tests (the non-finite case's half sums), the decode GEMMs of
# GPT-OSS-20B (group 64) and Qwen3-30B-A3B alone (probe), GPT-OSS-20B at 1 token with GEMM1 in 2 K slices, and
# group-128 layers on this tree + lib_new beside HEAD's tree + library (main), two rounds interleaved.
timeout 60 python -m pytest -q -p no:cacheprovider tests/gpu/test_token_digits.py > $OUT/gpu_tests.log 2>&1
echo "tests rc=$?"; tail -n 1 $OUT/gpu_tests.log
WOQ_DIGITS_GEMMS=gptoss_g1,gptoss_g2,qwen3_g1,qwen3_g2 WOQ_DIGITS_TOKENS=1,4,16 WOQ_DIGITS_KSPLITS=1,2 timeout 150 python bench/woq_digits_probe.py > $OUT/probe.log 2>&1; echo "probe rc=$?"
D1=decode:digits_ksplit1:after_trigger:plain; D2=decode:digits_ksplit2:after_trigger:plain
timeout 90 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes gpt-oss-20b --tokens 1 --variants "ours,ours:gemm1_tactic=$D2+gemm2_tactic=$D2,ours:token_digits=separate" --json $OUT/g64b_r1.json > $OUT/g64b_r1.log 2>&1; echo "g64b rc=$?"
for r in 1 2; do
  timeout 100 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,16 --variants ours --json $OUT/g128_new_r$r.json > $OUT/g128_new_r$r.log 2>&1; echo "new r$r rc=$?"
  (cd .device_carry/s24/old && MOE_BUILD_KERNELS_LIB=/tmp/main/libmoe_build_kernels.so PYTHONPATH=$PWD timeout 100 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,16 --variants ours --json $OUT/g128_main_r$r.json > $OUT/g128_main_r$r.log 2>&1); echo "main r$r rc=$?"
done
python .device_carry/s24/ab.py $OUT
tail -n 16 $OUT/probe.log
