# s31 call 2: the fitted tile rule's plan beside the old rule's tile (woq128x256 at these points) and bf16, W4A16 and
# W8A16, the three layers whose tiles moved, at 2048 and 4096 tokens.
T=wgmma:woq128x
timeout 420 python -m moe_build bench --quant w4a16_awq,w8a16 --shapes deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b \
  --tokens 2048,4096 --iters 5 --input-sets 2 \
  --variants "ours,ours:finalize=separate+gemm1_tactic=${T}256:plain:plain+gemm2_tactic=${T}256:plain:plain,ours_bf16" \
  --json $OUT/rule_r1.json > $OUT/rule.txt 2> $OUT/rule.log
echo "rule rc=$?"; cut -c1-200 $OUT/rule.txt
python - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "rule_r1.json")))
for p in d["points"]:
    v = p["variants"]
    g = {k: (x.get("graph_us") or float("nan")) for k, x in v.items()}
    old = [k for k in g if "256" in k][0]
    plan = v["ours"].get("plan", {})
    print(p["quant"], p["shape"], p["tokens"], plan.get("gemm1_tactic", "?").split(":")[1], "ours %.1f old256 %.1f bf16 %.1f  ours/bf16 %.3f old/bf16 %.3f" % (
        g["ours"], g[old], g["ours_bf16"], g["ours"] / g["ours_bf16"], g[old] / g["ours_bf16"]))
PY
