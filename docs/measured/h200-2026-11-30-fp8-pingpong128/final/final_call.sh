# Final library and plan: the FP8 wgmma GEMM tests on every tile (three processes side by side), the FP8 runner's
# layers; then the layers at 1024-4096 tokens with GEMM2 forced back onto coop128x192 beside the plan, two rounds, and
# the FP8 bench at 4096 tokens (dynamic and static scales, every variant).
P="timeout 300 python -m pytest -q -p no:cacheprovider"
$P tests/gpu/test_fp8_gemm.py -k "wgmma and not finalize" > $OUT/gpu_tests_fp8_store.log 2>&1 &
$P tests/gpu/test_fp8_gemm.py -k "finalize and wgmma" > $OUT/gpu_tests_fp8_finalize.log 2>&1 &
$P tests/gpu/test_fp8_gemm_gated.py tests/gpu/test_fp8_gemm_gated_quantized.py -k "wgmma or runner" > $OUT/gpu_tests_fp8_gated.log 2>&1 &
wait
$P tests/gpu/test_runner_fp8.py > $OUT/gpu_tests_runner_fp8.log 2>&1
for f in $OUT/gpu_tests_*.log; do echo "$(basename $f): $(tail -n 1 $f)"; done
OLD=ours:gemm2_tactic=wgmma:coop128x192:plain:evict_last
for r in 1 2; do
python -m moe_build bench --quant fp8 --tokens 1024,2048,4096 --variants ours,$OLD,ours_bf16 --iters 5 \
  --json $OUT/final_layers_round$r.json > $OUT/final_layers_round$r.log 2>&1
done
python -m moe_build bench --quant fp8,fp8_static --tokens 4096 --iters 7 --json $OUT/final_bench_4096.json > $OUT/final_bench_4096.log 2>&1
python - <<'PY'
import json, os
for name in ("final_layers_round1", "final_layers_round2", "final_bench_4096"):
    d = json.load(open(f"{os.environ['OUT']}/{name}.json"))
    for p in d["points"]:
        v = p["variants"]
        o, b = v["ours"]["graph_us"], v["ours_bf16"]["graph_us"]
        rest = " ".join(f"{k.replace('ours:', '')[:24]}={v[k].get('graph_us', 0):.0f}" for k in v if k not in ("ours", "ours_bf16"))
        print(name[-6:], p["quant"][:9], p["shape"][:10], p["tokens"], f"ours={o:.1f} bf16={b:.1f} x{b / o:.3f} err={v['ours']['rel_err']:.3f}",
              v["ours"]["plan"]["gemm1_tactic"].split(":")[1], v["ours"]["plan"]["gemm2_tactic"].split(":")[1], rest)
PY
