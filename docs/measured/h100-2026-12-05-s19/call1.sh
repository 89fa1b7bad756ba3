# s19 call 1: GEMM1's digits CTAs asking L2 for GEMM2's weights of their expert (experiment gemm2-l2-prefetch):
# a GPU test subset on the experiment library with the prefetch on, then W4A16 / W4AFP8 layers at 1 and 16 tokens,
# the prefetch off / on (MB_EXP_L2_PREFETCH_MB) alternated, two rounds, one library.
source .device_carry/s19/go.sh
export MOE_BUILD_KERNELS_LIB=/tmp/lib_pf/libmoe_build_kernels.so
mkdir -p $OUT/r
t0=$SECONDS
MB_EXP_L2_PREFETCH_MB=32 timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_runner_woq.py -k "digits" > $OUT/r/tests.log 2>&1; echo "tests rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/tests.log
for r in 1 2; do for mb in 0 32; do
  t0=$SECONDS
  MB_EXP_L2_PREFETCH_MB=$mb timeout 110 python3 -m moe_build bench --quant w4a16_awq,w4afp8 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,gpt-oss-20b --tokens 1,16 --variants ours --iters 10 \
    --input-sets 2 --json $OUT/r/pf${mb}_r$r.json > $OUT/r/pf${mb}_r$r.log 2>&1
  echo "round $r pf $mb rc=$? $((SECONDS-t0))s"
done; done
python3 - <<'PY'
import json, os, sys
sys.path.insert(0, "bench")
from lib_ab import graph_times, compare, table
out = os.environ["OUT"] + "/r"
runs = {}
for mb in (0, 32):
    runs[f"pf{mb}"] = [graph_times(json.load(open(f"{out}/pf{mb}_r{r}.json"))) for r in (1, 2)
                       if os.path.exists(f"{out}/pf{mb}_r{r}.json")]
rows = compare(runs)
json.dump(rows, open(f"{out}/summary.json", "w"), indent=1)
print(table(rows))
PY
tar czf $OUT/results1.tgz -C $OUT r
