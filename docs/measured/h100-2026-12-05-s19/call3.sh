# s19 call 3: int8 weights on the digits tile as stored (experiment int8-digits): its GEMM tests and the W8A16 runner
# tests on the experiment library and tree, then W8A16 layers at 1 / 4 / 16 tokens, main's plan (int8 on its decode
# kernel) against the experiment's (the digits tile where the int4 rule puts it), one library, rounds alternated.
source .device_carry/s19/go.sh
export MOE_BUILD_KERNELS_LIB=/tmp/lib_i8/libmoe_build_kernels.so
mkdir -p $OUT/r
t0=$SECONDS
cp .device_carry/s19/test_woq_gemm_exp.py tests/gpu/test_woq_gemm_exp.py
timeout 150 python3 -m pytest -q -x -p no:cacheprovider --gpu-cases=all tests/gpu/test_woq_gemm_exp.py -k "int8_digits" > $OUT/r/tests_gemm.log 2>&1; echo "gemm tests rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/tests_gemm.log
t0=$SECONDS
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_runner_woq.py -k "int8" > $OUT/r/tests_runner.log 2>&1; echo "runner tests rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/tests_runner.log
for r in 1 2; do for side in main exp; do
  t0=$SECONDS
  if [ $side = main ]; then PP="$PWD"; else PP="/tmp/exp_py"; fi
  PYTHONPATH=$PP timeout 100 python3 -m moe_build bench --quant w8a16 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,gpt-oss-20b --tokens 1,4,16 --variants ours --iters 10 \
    --input-sets 2 --json $OUT/r/${side}_r$r.json > $OUT/r/${side}_r$r.log 2>&1
  echo "round $r $side rc=$? $((SECONDS-t0))s"
done; done
python3 - <<'PY'
import json, os, sys
sys.path.insert(0, "bench")
from lib_ab import graph_times, compare, table
out = os.environ["OUT"] + "/r"
runs = {s: [graph_times(json.load(open(f"{out}/{s}_r{r}.json"))) for r in (1, 2) if os.path.exists(f"{out}/{s}_r{r}.json")]
        for s in ("main", "exp")}
rows = compare(runs)
json.dump(rows, open(f"{out}/summary.json", "w"), indent=1)
print(table(rows))
PY
tar czf $OUT/results3.tgz -C $OUT r
