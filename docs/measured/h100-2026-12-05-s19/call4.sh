# s19 call 4: calls 1 and 3 again, each experiment run from a copy of the repository carrying its own tree (in calls 1
# and 3 `python -m` from the repository root imported main's moe_build before PYTHONPATH's, so both sides ran main's
# Python: call 3's GEMM tests, which need only the library, stand).
source .device_carry/s19/go4.sh
mkdir -p $OUT/r
for x in pf i8; do (cd /tmp/repo_$x && python3 -c "import moe_build, inspect, moe_build.runner.experts as e; print('$x', moe_build.__file__, 'MB_EXP_L2_PREFETCH_MB' in inspect.getsource(e), 'digits_group' in inspect.getsource(e))"); done
# int8 digits: runner tests, then W8A16 layers, main's plan against the experiment's
export MOE_BUILD_KERNELS_LIB=/tmp/lib_i8/libmoe_build_kernels.so
t0=$SECONDS; (cd /tmp/repo_i8 && timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_runner_woq.py -k "int8" > $OUT/r/i8_tests_runner.log 2>&1); echo "i8 runner tests rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/i8_tests_runner.log
for r in 1 2; do for side in main exp; do
  t0=$SECONDS; D=$REPO; [ $side = exp ] && D=/tmp/repo_i8
  (cd $D && timeout 80 python3 -m moe_build bench --quant w8a16 --shapes qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b,gpt-oss-20b \
    --tokens 1,4,16 --variants ours --iters 10 --input-sets 2 --json $OUT/r/i8_${side}_r$r.json > $OUT/r/i8_${side}_r$r.log 2>&1)
  echo "i8 round $r $side rc=$? $((SECONDS-t0))s"
done; done
# GEMM2's weights asked into L2 by GEMM1: runner tests with it on, then W4A16 / W4AFP8 layers off / on
export MOE_BUILD_KERNELS_LIB=/tmp/lib_pf/libmoe_build_kernels.so
t0=$SECONDS; (cd /tmp/repo_pf && MB_EXP_L2_PREFETCH_MB=32 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_runner_woq.py -k "digits" > $OUT/r/pf_tests_runner.log 2>&1); echo "pf runner tests rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/pf_tests_runner.log
for r in 1 2; do for mb in 0 32; do
  t0=$SECONDS
  (cd /tmp/repo_pf && MB_EXP_L2_PREFETCH_MB=$mb timeout 75 python3 -m moe_build bench --quant w4a16_awq,w4afp8 \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,mixtral-8x7b --tokens 1,16 --variants ours --iters 10 \
    --input-sets 2 --json $OUT/r/pf${mb}_r$r.json > $OUT/r/pf${mb}_r$r.log 2>&1)
  echo "pf round $r mb $mb rc=$? $((SECONDS-t0))s"
done; done
python3 - <<'PY'
import json, os, sys
sys.path.insert(0, "bench")
from lib_ab import graph_times, compare, table
out = os.environ["OUT"] + "/r"
def load(names):
    return {n: [graph_times(json.load(open(f"{out}/{n}_r{r}.json"))) for r in (1, 2) if os.path.exists(f"{out}/{n}_r{r}.json")]
            for n in names}
for tag, names in (("i8", ("i8_main", "i8_exp")), ("pf", ("pf0", "pf32"))):
    try:
        rows = compare(load(names))
    except Exception as exc:
        print(tag, "no comparison:", exc); continue
    json.dump(rows, open(f"{out}/{tag}_summary.json", "w"), indent=1)
    print(table(rows))
d = json.load(open(f"{out}/i8_exp_r1.json"))
print(sorted({(p["shape"], p["tokens"], p["variants"]["ours"]["plan"]["gemm1_tactic"]) for p in d["points"]}))
PY
tar czf $OUT/results4.tgz -C $OUT r
