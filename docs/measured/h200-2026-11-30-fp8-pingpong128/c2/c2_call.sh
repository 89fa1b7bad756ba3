# pingpong 128x128 in 2x1 clusters: its GPU tests, the GEMMs beside pingpong128x128, and the layers forced onto it.
python -m pytest -q -x -p no:cacheprovider tests/gpu/test_fp8_gemm.py tests/gpu/test_fp8_gemm_gated.py -k "pingpong128x128c2" 2>&1 | tail -3 | tee $OUT/gpu_tests_c2.log
PP_TILES=pingpong128x128,pingpong128x128c2,coop128x192 python .device_carry/s12/pp128_probe.py 1024,2048,4096 > $OUT/c2_probe.jsonl 2>$OUT/c2_probe.err
tail -3 $OUT/c2_probe.err
python - <<'PY'
import json, os
from collections import defaultdict
d = defaultdict(dict)
for line in open(os.environ["OUT"] + "/c2_probe.jsonl"):
    r = json.loads(line)
    d[(r["gemm"], r["tokens"])][r["tile"]] = (r["us"], r["rel_err"])
for k, v in d.items():
    print(k, " ".join(f"{t}={u[0]}({u[1]})" for t, u in v.items()))
PY
G1=ours:gemm1_tactic=wgmma:pingpong128x128c2:plain:evict_last
G2=ours:gemm2_tactic=wgmma:pingpong128x128c2:plain:evict_last
for r in 1 2; do
python -m moe_build bench --quant fp8 --tokens 1024,2048,4096 --variants ours,$G1,$G2 --iters 5 \
  --json $OUT/c2_layers_round$r.json > $OUT/c2_layers_round$r.log 2>&1
done
python - <<'PY'
import json, os
for r in (1, 2):
    d = json.load(open(f"{os.environ['OUT']}/c2_layers_round{r}.json"))
    for p in d["points"]:
        v = p["variants"]
        cells = " ".join(f"{k.split('_tactic')[0].replace('ours:', '')}={v[k]['graph_us']:.1f}({v[k]['rel_err']:.3f})" for k in v)
        print(r, p["shape"], p["tokens"], v["ours"]["plan"]["gemm1_tactic"].split(":")[1], v["ours"]["plan"]["gemm2_tactic"].split(":")[1], cells)
PY
