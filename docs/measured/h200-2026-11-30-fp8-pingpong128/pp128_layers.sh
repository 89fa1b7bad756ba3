# Whole FP8 layers with GEMM1 / GEMM2 forced onto pingpong 128x128 beside the plan (its evict_last gated / finalize
# outputs as the plan's wgmma tactics at these counts), graph replay, two rounds.
G1=ours:gemm1_tactic=wgmma:pingpong128x128:plain:evict_last
G2=ours:gemm2_tactic=wgmma:pingpong128x128:plain:evict_last
for r in 1 2; do
python -m moe_build bench --quant fp8 --tokens ${PP_TOKENS:-256,1024,2048,4096} --variants ours,$G1,$G2 --iters 5 \
  --json $OUT/pp128_layers_round$r.json > $OUT/pp128_layers_round$r.log 2>&1
done
python - <<'PY'
import json, os
for r in (1, 2):
    d = json.load(open(f"{os.environ['OUT']}/pp128_layers_round{r}.json"))
    for p in d["points"]:
        v = p["variants"]
        cells = " ".join(f"{k.split('_tactic')[0].replace('ours:', '')}={v[k]['graph_us']:.1f}({v[k]['rel_err']:.3f})" for k in v)
        print(r, p["shape"], p["tokens"], cells)
PY
