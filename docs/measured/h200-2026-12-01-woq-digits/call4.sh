# s21 call 4: W4A16 layers, the digits plan (this tree, lib_new) beside HEAD's (2cbeb00's tree, lib_old), two rounds
# alternated; then the runner's weight-only GPU tests on the digits plan.
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins; [ -e moe_build/cpp ] || ln -s ../cpp moe_build/cpp
mkdir -p /tmp/oldtree && tar -xzf .device_carry/s21/old_tree.tgz -C /tmp/oldtree
ARGS="--quant w4a16_awq --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2,4,8,16,32 --variants ours --iters 20"
new() { MOE_BUILD_KERNELS_LIB=/tmp/new/libmoe_build_kernels.so timeout 170 python -m moe_build bench $ARGS --json $OUT/new_r$1.json > $OUT/new_r$1.log 2>&1; }
old() { (cd /tmp/oldtree && PYTHONPATH=/tmp/oldtree MOE_BUILD_KERNELS_LIB=/tmp/old/libmoe_build_kernels.so timeout 170 python -m moe_build bench $ARGS --json $OUT/old_r$1.json > $OUT/old_r$1.log 2>&1); }
new 1; old 1; old 2; new 2
python .device_carry/s21/ab_table.py $OUT
timeout 120 python -m pytest -q -x -p no:cacheprovider tests/gpu/test_runner_woq.py -k "int4_g128 or digits or int4_g64" > $OUT/tests_runner.log 2>&1
tail -3 $OUT/tests_runner.log
