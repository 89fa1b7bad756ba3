# s27 call 7: GEMM2 at one CTA an SM at the counts call 6 left out (Mixtral-8x7B 2 / 8 / 16 tokens: K splits 4 / 2 / 2; GPT-OSS-20B 2 / 8 / 12: 1)
timeout 40 python -m moe_build bench --quant fp8_block --shapes gpt-oss-20b --tokens 2,8,12 --iters 20 --variants "ours,ours:gemm2_tactic=decode:ksplit1:after_trigger:plain" --json $OUT/g2o.json > /dev/null 2>&1; echo "o rc=$?"
timeout 25 python -m moe_build bench --quant fp8_block --shapes mixtral-8x7b --tokens 8,16 --iters 20 --variants "ours,ours:gemm2_tactic=decode:ksplit2:after_trigger:plain" --json $OUT/g2m.json > /dev/null 2>&1; echo "m rc=$?"
python - <<'PY'
import json, os, glob
out = os.environ["OUT"]
for f in sorted(glob.glob(f"{out}/g2*.json")):
    for p in json.load(open(f))["points"]:
        print(os.path.basename(f), p["shape"], p["tokens"], "  ".join(f"{k[-30:]} {v.get('graph_us', float('nan')):.1f}" for k, v in p["variants"].items()), p["variants"]["ours"]["plan"]["gemm2_tactic"])
PY
