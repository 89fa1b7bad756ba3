# s19 call 2: the fused routing prologue at 16 warps with each lane's keys in registers. lib_new = this tree,
# lib_main = main 2e3c421's (PTX-identical to 14e3319). The prologue's GPU tests and the bf16/FP8 runners' at small
# token counts, then layer steps at 16/256 tokens and the FP8 bench at 1/16/256 tokens, main/new alternated, two rounds.
P="timeout 170 python -m pytest -q -p no:cacheprovider -x"
$P tests/gpu/test_stage_kernels.py > $OUT/gpu_tests_stages.log 2>&1 &
$P tests/gpu/test_runner.py > $OUT/gpu_tests_runner.log 2>&1 &
wait
for f in $OUT/gpu_tests_*.log; do echo "$(basename $f): $(tail -n 1 $f)"; done
grep -E "^FAILED|Error" $OUT/gpu_tests_*.log | head -10
for v in main new; do
  L=/tmp/$v/libmoe_build_kernels.so
  MOE_BUILD_KERNELS_LIB=$L LAYER_STEPS_SHAPES=qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b LAYER_STEPS_TOKENS=16,256 \
    LAYER_STEPS_QUANTS=fp8 timeout 60 python bench/layer_steps_probe.py $OUT/steps_$v.json > $OUT/steps_$v.log 2>&1
done
grep -E "T=|fused_maps" $OUT/steps_main.log $OUT/steps_new.log
for r in 1 2; do
  for v in main new; do
    MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so timeout 150 python -m moe_build bench --quant fp8,fp8_block \
      --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16,256 --variants ours \
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
                p["variants"]["ours"]["graph_us"], p["targets"]["floor"]["limit_us"])
for k, x in rows.items():
    cells = "  ".join(f"{v}{r} {o:7.1f}/{lim:6.1f}{'*' if o <= lim else ' '}" for (v, r), (o, lim) in sorted(x.items(), key=lambda i: (i[0][1], i[0][0] != "main")))
    print(f"{k[0][:12]:12} {k[1]:9} {k[2]:5} {cells}")
PY
