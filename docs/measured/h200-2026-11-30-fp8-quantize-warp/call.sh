# The warp-per-row quantize step: its GPU tests, the FP8 layers' kernels (layer_steps_probe), then the FP8 bench at
# 256, 1024 and 4096 tokens (DeepSeek-V3 at 4096 in a third round) with HEAD's library (OLD_LIB) and this one alternated, two rounds.
P="python -m pytest -q -p no:cacheprovider"
$P tests/gpu/test_fp8_quantize.py > $OUT/gpu_tests_fp8_quantize.log 2>&1; tail -n 1 $OUT/gpu_tests_fp8_quantize.log
$P tests/gpu/test_runner_fp8.py > $OUT/gpu_tests_runner_fp8.log 2>&1; tail -n 1 $OUT/gpu_tests_runner_fp8.log
for v in old new; do
  L=$MOE_BUILD_KERNELS_LIB; [ $v = old ] && L=$OLD_LIB
  MOE_BUILD_KERNELS_LIB=$L LAYER_STEPS_SHAPES=gpt-oss-20b,qwen3-30b-a3b,deepseek-v2-lite LAYER_STEPS_TOKENS=256,1024,4096 \
    LAYER_STEPS_QUANTS=fp8 python bench/layer_steps_probe.py $OUT/layer_steps_$v.json > $OUT/layer_steps_$v.log 2>&1
  echo "layer steps, $v library"; grep -E "replay|fc1_activation" $OUT/layer_steps_$v.log
done
for r in 1 2; do
  for v in old new; do
    L=$MOE_BUILD_KERNELS_LIB; [ $v = old ] && L=$OLD_LIB
    MOE_BUILD_KERNELS_LIB=$L python -m moe_build bench --quant fp8 --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b \
      --tokens 256,1024,4096 --variants ours,ours_bf16 --iters 5 --json $OUT/bench_${v}_round$r.json > $OUT/bench_${v}_round$r.log 2>&1
  done
done
for v in old new; do
  L=$MOE_BUILD_KERNELS_LIB; [ $v = old ] && L=$OLD_LIB
  MOE_BUILD_KERNELS_LIB=$L python -m moe_build bench --quant fp8 --shapes deepseek-v3 --tokens 4096 \
    --variants ours,ours_bf16 --iters 5 --json $OUT/bench_${v}_round3.json > $OUT/bench_${v}_round3.log 2>&1
done
python - <<'PY'
import json, os
for r in (1, 2, 3):
    for v in ("old", "new"):
        d = json.load(open(f"{os.environ['OUT']}/bench_{v}_round{r}.json"))
        for p in d["points"]:
            o, b = p["variants"]["ours"]["graph_us"], p["variants"]["ours_bf16"]["graph_us"]
            print(f"round {r} {v} {p['shape'][:16]:16} {p['tokens']:5} ours={o:7.1f} bf16={b:7.1f} x{b / o:.3f} "
                  f"err={p['variants']['ours']['rel_err']:.4f}")
PY
