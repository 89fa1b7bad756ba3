# s27 call 5: block-128 GEMM1 K splits on the twocta decode tile, DeepSeek-V3 and Mixtral-8x7B at 1-4 tokens (the
# block-128 split rule was measured on the one-CTA kernel; the rowwise kernel, two CTAs an SM, splits these to 4).
for r in 1 2; do
V=ours
for k in 1 2 4; do V="$V,ours:gemm1_tactic=decode:twocta_ksplit$k:after_trigger:plain"; done
timeout 150 python -m moe_build bench --quant fp8_block --shapes deepseek-v3,mixtral-8x7b --tokens 1,2,4 --iters 20 --variants "$V" --json $OUT/ks_r$r.json > $OUT/ks_r$r.log 2>&1
echo "round $r rc=$?"
done
python - <<'PY'
import json, os
out = os.environ["OUT"]
for r in (1, 2):
    for p in json.load(open(f"{out}/ks_r{r}.json"))["points"]:
        v = p["variants"]
        cells = "  ".join(f"{k.replace('ours:gemm1_tactic=decode:twocta_', '').replace(':after_trigger:plain', '')} {x.get('graph_us', float('nan')):.1f}" for k, x in v.items())
        print(r, p["shape"], p["tokens"], cells, "plan", v["ours"]["plan"]["gemm1_tactic"])
PY
