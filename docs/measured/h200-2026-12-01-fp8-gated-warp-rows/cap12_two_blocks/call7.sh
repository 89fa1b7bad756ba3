# s19 call 7: gated warp rows up to 12 units a lane at two blocks an SM (128 registers, 32 bytes of spill) against the
# final form (lib_main = bec8316's library, lib_new = this build). Activation tests, block-128 steps at 1024/4096.
timeout 120 python -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_quantize.py -k "fc1_activation_fp8_warp_rows" > $OUT/gpu_tests_fc1.log 2>&1
tail -n 1 $OUT/gpu_tests_fc1.log; grep -E "^FAILED" $OUT/gpu_tests_fc1.log | head -5
for v in main new; do
  MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so LAYER_STEPS_SHAPES=gpt-oss-20b,qwen3-30b-a3b \
    LAYER_STEPS_TOKENS=1024,4096 LAYER_STEPS_QUANTS=fp8_block timeout 50 python bench/layer_steps_probe.py $OUT/steps_$v.json > $OUT/steps_$v.log 2>&1
done
python - <<'PY'
import json, os
o = {(p['shape'], p['quant'], p['tokens']): p for p in json.load(open(f"{os.environ['OUT']}/steps_main.json"))}
n = {(p['shape'], p['quant'], p['tokens']): p for p in json.load(open(f"{os.environ['OUT']}/steps_new.json"))}
ex = lambda p, w: sum(v['us'] for kk, v in p['kernels'].items() if w in kk)
for k in o:
    print(f"{k[0][:14]:14} {k[1]:9} {k[2]:5} fc1 {ex(o[k], 'fc1_act'):6.1f} -> {ex(n[k], 'fc1_act'):6.1f} ({[kk[5:40] for kk in n[k]['kernels'] if 'fc1_act' in kk]})  replay {o[k]['replay_us']:7.1f} -> {n[k]['replay_us']:7.1f}")
PY
