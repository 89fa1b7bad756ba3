# s20 call 7: the decode grids' chunk bound floor((max_rows + 7 min(E, max_rows)) / 8) (lib_new) beside HEAD's
# ceil(max_rows / 8) + min(E, max_rows) (lib_main): layers at 1 and 16 tokens, alternated, two rounds; then the decode
# kernels' and the runners' GPU tests on lib_new.
S=qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b
for r in 1 2; do for v in main new; do for q in none fp8 w4a16_awq; do
  MOE_BUILD_KERNELS_LIB=/tmp/$v/libmoe_build_kernels.so timeout 100 python -m moe_build bench $([ $q = none ] || echo --quant $q) \
    --shapes $S --tokens 1,16 --variants ours --iters 10 --json $OUT/${q}_${v}_$r.json > $OUT/${q}_${v}_$r.log 2>&1 || tail -3 $OUT/${q}_${v}_$r.log
done; done; done
python - <<'PY'
import json, os
O = os.environ['OUT']
def pts(f):
    try: d = json.load(open(f"{O}/{f}"))
    except Exception as e: return {}
    return {(p.get('quant', 'bf16'), p['shape'], p['tokens']): p['variants']['ours']['graph_us'] for p in d['points']}
for q in ('none', 'fp8', 'w4a16_awq'):
    runs = {(v, r): pts(f"{q}_{v}_{r}.json") for v in ('main', 'new') for r in (1, 2)}
    for k in sorted(runs[('main', 1)]):
        m = [runs[('main', r)].get(k, float('nan')) for r in (1, 2)]; n = [runs[('new', r)].get(k, float('nan')) for r in (1, 2)]
        print(f"{k[0]:10} {k[1]:17} {k[2]:3}  main {m[0]:7.1f} {m[1]:7.1f}  new {n[0]:7.1f} {n[1]:7.1f}  new/main {sum(n)/sum(m):.3f}")
PY
export MOE_BUILD_KERNELS_LIB=/tmp/new/libmoe_build_kernels.so
timeout 60 python -m pytest -q -p no:cacheprovider tests/gpu/test_gemm_kernels.py -k decode > $OUT/gpu_tests_gemm_decode.log 2>&1; tail -n 1 $OUT/gpu_tests_gemm_decode.log
timeout 60 python -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gemm.py -k decode > $OUT/gpu_tests_fp8_decode.log 2>&1; tail -n 1 $OUT/gpu_tests_fp8_decode.log
timeout 60 python -m pytest -q -p no:cacheprovider tests/gpu/test_woq_gemm.py -k "not mma and not dequantize" > $OUT/gpu_tests_woq_decode.log 2>&1; tail -n 1 $OUT/gpu_tests_woq_decode.log
timeout 170 python -m pytest -q -p no:cacheprovider tests/gpu/test_runner.py tests/gpu/test_runner_fp8.py tests/gpu/test_runner_woq.py > $OUT/gpu_tests_runners.log 2>&1; tail -n 1 $OUT/gpu_tests_runners.log
grep -h "^FAILED" $OUT/gpu_tests_*.log | head -5
rm -f $OUT/none_*.log $OUT/fp8_*.log $OUT/w4a16_awq_*.log
