# s20 call 6: call 5's comparison for the FP8 and W4A16 layers (decode grid as (column blocks, chunks) = lib_new).
S=qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b
for r in 1 2; do for v in main new; do for q in fp8 w4a16_awq; do
  MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so timeout 100 python -m moe_build bench --quant $q \
    --shapes $S --tokens 16 --variants ours --iters 10 --json $OUT/${q}_${v}_$r.json > $OUT/${q}_${v}_$r.log 2>&1
done; done; done
python - <<'PY'
import json, os
O = os.environ['OUT']
def pts(f):
    try: d = json.load(open(f"{O}/{f}"))
    except Exception as e: return {}
    return {(p.get('quant', 'bf16'), p['shape'], p['tokens']): p['variants']['ours']['graph_us'] for p in d['points']}
for q in ('fp8', 'w4a16_awq'):
    runs = {(v, r): pts(f"{q}_{v}_{r}.json") for v in ('main', 'new') for r in (1, 2)}
    for k in sorted(runs[('main', 1)]):
        m = [runs[('main', r)].get(k, float('nan')) for r in (1, 2)]; n = [runs[('new', r)].get(k, float('nan')) for r in (1, 2)]
        print(f"{k[0]:10} {k[1]:17} {k[2]:3}  main {m[0]:7.1f} {m[1]:7.1f}  new {n[0]:7.1f} {n[1]:7.1f}  new/main {sum(n)/sum(m):.3f}")
PY
rm -f $OUT/*.log
