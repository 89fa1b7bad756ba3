step tests_digits 150 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_token_digits.py
step tests_woq 200 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py -k "digits or decode_tile or a_type"
step probe 130 env OUT="$R" WOQ_DIGITS_KIND=mxfp4 WOQ_DIGITS_TOKENS=1,2,4,8,16,32 PYTHONPATH="$PWD/bench:$PWD" python3 bench/woq_digits_probe.py
step ab_new_1 100 python3 -m moe_build bench --quant wfp4a16,w4a16_awq --variants ours --tokens 1,2,4,8,16,32 --input-sets 2 --json "$R/ab_new_1.json"
step ab_old_1 100 env -C /tmp/base PYTHONPATH=. MOE_BUILD_KERNELS_LIB=/tmp/base/libmoe_build_kernels.so python3 -m moe_build bench --quant wfp4a16,w4a16_awq --variants ours --tokens 1,2,4,8,16,32 --input-sets 2 --json "$R/ab_old_1.json"
for f in tests_digits tests_woq; do echo "==== $f"; grep -E "^(FAILED|ERROR)" "$R/$f.log" | head -8; tail -n 2 "$R/$f.log"; done
echo "==== probe"; tail -n 60 "$R/probe.log" | head -52
