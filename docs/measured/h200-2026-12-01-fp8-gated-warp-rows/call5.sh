# s19 call 5: the final form: gated warp rows up to 6 units a lane (GPT-OSS-20B's 2880-wide gated rows back on the
# staged kernel). lib_new = lib_s19d, lib_main = main 2e3c421's. The activation tests, block-128 layer steps at
# 1024/4096 main/new, one bench round of block-128 at 1024/4096 main/new.
timeout 150 python -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_quantize.py -k "fc1_activation" > $OUT/gpu_tests_fc1.log 2>&1
tail -n 1 $OUT/gpu_tests_fc1.log; grep -E "^FAILED" $OUT/gpu_tests_fc1.log | head -5
for v in main new; do
  MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so LAYER_STEPS_SHAPES=qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b \
    LAYER_STEPS_TOKENS=1024,4096 LAYER_STEPS_QUANTS=fp8_block,fp8 timeout 60 python bench/layer_steps_probe.py $OUT/steps_$v.json > $OUT/steps_$v.log 2>&1
done
python - <<'PY'
import json, os
o = {(p['shape'], p['quant'], p['tokens']): p for p in json.load(open(f"{os.environ['OUT']}/steps_main.json"))}
n = {(p['shape'], p['quant'], p['tokens']): p for p in json.load(open(f"{os.environ['OUT']}/steps_new.json"))}
ex = lambda p, w: sum(v['us'] for kk, v in p['kernels'].items() if w in kk)
for k in o:
    print(f"{k[0][:14]:14} {k[1]:9} {k[2]:5} expand {ex(o[k], 'expand'):6.1f} -> {ex(n[k], 'expand'):6.1f}  fc1 {ex(o[k], 'fc1_act'):6.1f} -> {ex(n[k], 'fc1_act'):6.1f} ({[kk[5:40] for kk in n[k]['kernels'] if 'fc1_act' in kk]})  replay {o[k]['replay_us']:7.1f} -> {n[k]['replay_us']:7.1f}")
PY
for v in main new; do
  MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so timeout 120 python -m moe_build bench --quant fp8_block \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1024,4096 --variants ours,ours_bf16 \
    --iters 5 --json $OUT/bench_${v}.json > $OUT/bench_${v}.log 2>&1 || echo "bench $v rc=$?"
done
python - <<'PY'
import json, os
rows = {}
for v in ("main", "new"):
    d = json.load(open(f"{os.environ['OUT']}/bench_{v}.json"))
    for p in d["points"]:
        rows.setdefault((p["shape"], p["quant"], p["tokens"]), {})[v] = (p["variants"]["ours"]["graph_us"], p["variants"]["ours_bf16"]["graph_us"])
for k, x in rows.items():
    print(f"{k[0][:12]:12} {k[1]:9} {k[2]:5} " + "  ".join(f"{v} {o:7.1f} x{b / o:.3f}" for v, (o, b) in x.items()))
PY
