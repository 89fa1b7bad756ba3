# s22 call 6: the digits kernel's one-mma bodies waiting once per 4 groups instead of 3 (lib_new) beside HEAD
# (lib_main), the probe at the planner's split; then W4A16 layers alternated where the probe wins.
for lib in new main; do
  mkdir -p $OUT/probe_$lib
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,2,4,16 OUT=$OUT/probe_$lib timeout 150 python bench/woq_digits_probe.py > $OUT/probe_$lib.log 2>&1 || echo "probe $lib failed"
done
python - $OUT <<'PY'
import json, sys, os
d = sys.argv[1]
runs = {lib: {(r["gemm"], r["tokens"]): r for r in json.load(open(os.path.join(d, f"probe_{lib}", "woq_digits_probe.json")))} for lib in ("main", "new")}
print(f"{'gemm':<11} {'tok':>4} {'main':>7} {'new':>7} {'new/main':>8}  (digits with step, us)   err new")
for key in sorted(runs["main"]):
    r = [runs[l].get(key, {}).get("digits_us") for l in ("main", "new")]
    if r[0] is None: continue
    print(f"{key[0]:<11} {key[1]:>4} " + " ".join(f"{x:>7.1f}" for x in r) + f" {r[1] / r[0]:>8.3f}   {runs['new'][key].get('digits_rel_err', 0):.1e}")
PY
