# The FP8 epilogue's column scales read once a tile: GPU tests of every wgmma epilogue (three processes side by side),
# then the FP8 bench with this tree's library (new) and the one before it (old = the warp-per-row quantize step),
# alternated, two rounds.
P="timeout 170 python -m pytest -q -p no:cacheprovider -x"
$P tests/gpu/test_fp8_gemm.py -k "wgmma" > $OUT/gpu_tests_fp8_gemm.log 2>&1 &
$P tests/gpu/test_fp8_gemm_gated.py tests/gpu/test_fp8_gemm_gated_quantized.py > $OUT/gpu_tests_fp8_gated.log 2>&1 &
$P tests/gpu/test_gemm_kernels.py -k "wgmma" > $OUT/gpu_tests_gemm16_wgmma.log 2>&1 &
wait
timeout 120 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner_fp8.py tests/gpu/test_runner.py > $OUT/gpu_tests_runners.log 2>&1
for f in $OUT/gpu_tests_*.log; do echo "$(basename $f): $(tail -n 1 $f)"; done
for r in 1 2; do
  for v in old new; do
    L=$MOE_BUILD_KERNELS_LIB; [ $v = old ] && L=$OLD_LIB
    MOE_BUILD_KERNELS_LIB=$L python -m moe_build bench --quant fp8 --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b \
      --tokens 256,4096 --variants ours,ours_bf16 --iters 5 --json $OUT/epi_${v}_round$r.json > $OUT/epi_${v}_round$r.log 2>&1
  done
done
python - <<'PY'
import json, os
for r in (1, 2):
    for v in ("old", "new"):
        d = json.load(open(f"{os.environ['OUT']}/epi_{v}_round{r}.json"))
        for p in d["points"]:
            o, b = p["variants"]["ours"]["graph_us"], p["variants"]["ours_bf16"]["graph_us"]
            print(f"round {r} {v} {p['shape'][:16]:16} {p['tokens']:5} ours={o:7.1f} bf16={b:7.1f} x{b / o:.3f} "
                  f"err={p['variants']['ours']['rel_err']:.4f} bf16err={p['variants']['ours_bf16']['rel_err']:.4f}")
PY
