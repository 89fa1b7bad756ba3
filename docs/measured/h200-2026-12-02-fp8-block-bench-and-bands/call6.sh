# s27 call 6: block-128 GEMM2 forced back to one CTA an SM beside the plan (twocta) on the other shapes at 2-6 tokens
# (GPT-OSS-20B's GEMM2 ran 3-4 us faster so at 4-5 tokens in call 2).
for r in 1 2; do
timeout 70 python -m moe_build bench --quant fp8_block --shapes qwen3-30b-a3b,deepseek-v2-lite,deepseek-v3 --tokens 2,4,6 --iters 20 --variants "ours,ours:gemm2_tactic=decode:ksplit1:after_trigger:plain" --json $OUT/g2_r$r.json > /dev/null 2>&1; echo "g2 r$r rc=$?"
timeout 35 python -m moe_build bench --quant fp8_block --shapes mixtral-8x7b --tokens 4,6 --iters 20 --variants "ours,ours:gemm2_tactic=decode:ksplit2:after_trigger:plain" --json $OUT/g2m_r$r.json > /dev/null 2>&1; echo "g2m r$r rc=$?"
done
python - <<'PY'
import json, os, glob
out = os.environ["OUT"]
for f in sorted(glob.glob(f"{out}/g2*_r*.json")):
    for p in json.load(open(f))["points"]:
        print(os.path.basename(f), p["shape"], p["tokens"], "  ".join(f"{k[-30:]} {v.get('graph_us', float('nan')):.1f}" for k, v in p["variants"].items()))
PY
