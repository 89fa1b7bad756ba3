# s19 call 3: the FP8 warp-row kernels at 6 and 12 units a lane (the quantize step) and 12 (the expansion), with the
# fused prologue at 16 warps. lib_new = this tree (lib_s19b), lib_main = main 2e3c421's. GPU tests, layer steps at
# 1024/4096, then the FP8 bench at 1024/4096 main/new alternated, two rounds.
P="timeout 200 python -m pytest -q -p no:cacheprovider"
$P tests/gpu/test_fp8_quantize.py > $OUT/gpu_tests_fp8_quantize.log 2>&1 &
$P tests/gpu/test_runner_fp8.py > $OUT/gpu_tests_runner_fp8.log 2>&1 &
wait
for f in $OUT/gpu_tests_*.log; do echo "$(basename $f): $(tail -n 1 $f)"; done
grep -E "^FAILED|Error" $OUT/gpu_tests_*.log | head -10
for v in main new; do
  MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so LAYER_STEPS_SHAPES=qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b \
    LAYER_STEPS_TOKENS=1024,4096 LAYER_STEPS_QUANTS=fp8,fp8_block timeout 80 python bench/layer_steps_probe.py $OUT/steps_$v.json > $OUT/steps_$v.log 2>&1
done
python - <<'PY'
import json, os
o = {(p['shape'], p['quant'], p['tokens']): p for p in json.load(open(f"{os.environ['OUT']}/steps_main.json"))}
n = {(p['shape'], p['quant'], p['tokens']): p for p in json.load(open(f"{os.environ['OUT']}/steps_new.json"))}
ex = lambda p, w: sum(v['us'] for kk, v in p['kernels'].items() if w in kk)
for k in o:
    print(f"{k[0][:14]:14} {k[1]:9} {k[2]:5} expand {ex(o[k], 'expand'):6.1f} -> {ex(n[k], 'expand'):6.1f}  fc1 {ex(o[k], 'fc1_act'):6.1f} -> {ex(n[k], 'fc1_act'):6.1f}  replay {o[k]['replay_us']:7.1f} -> {n[k]['replay_us']:7.1f}")
PY
for r in 1 2; do
  for v in main new; do
    MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so timeout 170 python -m moe_build bench --quant fp8,fp8_block \
      --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1024,4096 --variants ours,ours_bf16 \
      --iters 5 --json $OUT/bench_${v}_round$r.json > $OUT/bench_${v}_round$r.log 2>&1 || echo "bench $v $r rc=$?"
  done
done
python - <<'PY'
import json, os
rows = {}
for r in (1, 2):
    for v in ("main", "new"):
        try: d = json.load(open(f"{os.environ['OUT']}/bench_{v}_round{r}.json"))
        except Exception as e: print(v, r, e); continue
        for p in d["points"]:
            rows.setdefault((p["shape"], p.get("quant", "?"), p["tokens"]), {})[(v, r)] = (
                p["variants"]["ours"]["graph_us"], p["variants"]["ours_bf16"]["graph_us"])
for k, x in rows.items():
    cells = "  ".join(f"{v}{r} {o:7.1f} x{b / o:.3f}" for (v, r), (o, b) in sorted(x.items(), key=lambda i: (i[0][1], i[0][0] != "main")))
    print(f"{k[0][:12]:12} {k[1]:9} {k[2]:5} {cells}")
PY
