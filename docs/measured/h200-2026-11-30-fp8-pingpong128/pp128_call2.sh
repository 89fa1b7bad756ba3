# GPU tests with the slab-walking epilogue on every tile (FP8 and 16-bit wgmma), the FP8 runner's layers on the new
# plan; then the FP8 bench at 4096 tokens, dynamic and static input scales, two rounds.
P="timeout 200 python -m pytest -q -p no:cacheprovider"
$P tests/gpu/test_fp8_gemm.py tests/gpu/test_fp8_gemm_gated.py -k "wgmma or planner" 2>&1 | tail -4 | tee $OUT/gpu_tests_fp8_wgmma.log
$P tests/gpu/test_runner_fp8.py 2>&1 | tail -4 | tee $OUT/gpu_tests_runner_fp8.log
$P tests/gpu/test_gemm_kernels.py -k "wgmma" 2>&1 | tail -4 | tee $OUT/gpu_tests_gemm_wgmma.log
for r in 1 2; do
  python -m moe_build bench --quant fp8,fp8_static --tokens 4096 --iters 7 --json $OUT/bench_fp8_4096_round$r.json > $OUT/bench_fp8_4096_round$r.log 2>&1
done
python - <<'PY'
import json, os
for r in (1, 2):
    d = json.load(open(f"{os.environ['OUT']}/bench_fp8_4096_round{r}.json"))
    for p in d["points"]:
        v = p["variants"]
        o, b = v["ours"]["graph_us"], v["ours_bf16"]["graph_us"]
        rest = " ".join(f"{k.replace('ours:', '')}={v[k].get('graph_us', v[k].get('us', 0)):.0f}" for k in v if k not in ("ours", "ours_bf16"))
        print(r, p["quant"], p["shape"], f"ours={o:.1f} bf16={b:.1f} ratio={b / o:.3f}", v["ours"]["plan"]["gemm1_tactic"].split(":")[1], v["ours"]["plan"]["gemm2_tactic"].split(":")[1], rest)
PY
