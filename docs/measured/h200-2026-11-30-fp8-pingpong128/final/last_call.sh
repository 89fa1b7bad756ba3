# The FP8 runner's layers on the final plan; the FP8 bench at 4096 tokens with static scales (every variant); then as
# many of the finalize wgmma GEMM tests as the time left allows (-x: stops at a failure).
P="python -m pytest -q -p no:cacheprovider"
timeout 90 $P tests/gpu/test_runner_fp8.py > $OUT/gpu_tests_runner_fp8_final.log 2>&1
tail -n 1 $OUT/gpu_tests_runner_fp8_final.log
timeout 100 python -m moe_build bench --quant fp8_static --tokens 4096 --iters 7 --json $OUT/final_static_4096.json > $OUT/final_static_4096.log 2>&1
python - <<'PY'
import json, os
d = json.load(open(f"{os.environ['OUT']}/final_static_4096.json"))
for p in d["points"]:
    v = p["variants"]
    o, b = v["ours"]["graph_us"], v["ours_bf16"]["graph_us"]
    rest = " ".join(f"{k.replace('ours:', '')[:22]}={v[k].get('graph_us', 0):.0f}" for k in v if k not in ("ours", "ours_bf16"))
    print(p["shape"][:10], f"ours={o:.1f} bf16={b:.1f} x{b / o:.3f}", rest)
PY
timeout 60 $P -x tests/gpu/test_fp8_gemm.py -k "finalize and wgmma and not pingpong128" > $OUT/gpu_tests_fp8_finalize_rest.log 2>&1
tail -c 400 $OUT/gpu_tests_fp8_finalize_rest.log
