step tests_w4afp8 100 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_runner_w4afp8.py -k "digits"
export LAYER_STEPS_QUANTS=wfp4a16 LAYER_STEPS_SHAPES=mixtral-8x7b,gpt-oss-20b,qwen3-30b-a3b LAYER_STEPS_TOKENS=1,8
step steps_new 70 env -C "$R" PYTHONPATH="$PWD/bench:$PWD" python3 "$PWD/bench/layer_steps_probe.py" "$R/steps_new.json"
step steps_old 70 env -C "$R" PYTHONPATH="/tmp/base:$PWD/bench" MOE_BUILD_KERNELS_LIB=/tmp/base/libmoe_build_kernels.so python3 "$PWD/bench/layer_steps_probe.py" "$R/steps_old.json"
for round in ${ROUNDS:-1}; do
  step ab_new_$round 110 python3 -m moe_build bench --quant wfp4a16 --variants ours --tokens 1,2,4,8,16,24,32,48 --input-sets 2 --json "$R/ab_new_$round.json"
  step ab_old_$round 110 env -C /tmp/base PYTHONPATH=. MOE_BUILD_KERNELS_LIB=/tmp/base/libmoe_build_kernels.so python3 -m moe_build bench --quant wfp4a16 --variants ours --tokens 1,2,4,8,16,24,32,48 --input-sets 2 --json "$R/ab_old_$round.json"
done
echo "==== tests_w4afp8"; grep -E "^(FAILED|ERROR)" "$R/tests_w4afp8.log" | head -8; tail -n 2 "$R/tests_w4afp8.log"
for f in "$R"/ab_*.log; do echo "== $f"; grep "T=" "$f" | awk '{print $2, $3, $NF}' | tr '\n' ';'; echo; done
