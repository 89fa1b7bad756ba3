# s21 call 3: the digits kernel with the mmas per step from each chunk's rows: tests, then the probe.
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins; [ -e moe_build/cpp ] || ln -s ../cpp moe_build/cpp
timeout 200 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_token_digits.py \
  "tests/gpu/test_woq_gemm.py" -k "digits" > $OUT/tests_gemm.log 2>&1
tail -3 $OUT/tests_gemm.log
timeout 300 python bench/woq_digits_probe.py > $OUT/probe.log 2>&1
grep -v "^{" $OUT/probe.log | tail -50
D=decode:digits_ksplit
A=:after_trigger:plain
b() { timeout 150 python -m moe_build bench --quant w4a16_awq --iters 20 --shapes $1 --tokens $2 --variants "ours,ours:$3" --json $OUT/bench_$4.json > $OUT/bench_$4.log 2>&1; tail -12 $OUT/bench_$4.log | grep -v "^$"; }
b mixtral-8x7b 1 "gemm1_tactic=${D}1$A+gemm2_tactic=${D}4$A" mixtral1
b mixtral-8x7b 16 "gemm1_tactic=${D}1$A" mixtral16
b qwen3-30b-a3b,deepseek-v2-lite 1 "gemm1_tactic=${D}2$A+gemm2_tactic=${D}2$A" small1
b qwen3-30b-a3b,deepseek-v2-lite 16 "gemm1_tactic=${D}1$A+gemm2_tactic=${D}1$A" small16
