# s22 call 5: the digits kernel with bulk L2 prefetches of each warp's weight rows (and the slice's scales and
# zeros) ahead of its register loads: P = 8 groups ahead (lib_new) and 16 (lib_old) beside HEAD (lib_main).
# The probe (planner's split) for each, then W4A16 layers alternated.
for lib in new old main; do
  mkdir -p $OUT/probe_$lib
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,2,4,16 OUT=$OUT/probe_$lib timeout 150 python bench/woq_digits_probe.py > $OUT/probe_$lib.log 2>&1 || echo "probe $lib failed"
done
python - $OUT <<'PY'
import json, sys, os
d = sys.argv[1]
runs = {lib: {(r["gemm"], r["tokens"]): r for r in json.load(open(os.path.join(d, f"probe_{lib}", "woq_digits_probe.json")))} for lib in ("main", "new", "old")}
print(f"{'gemm':<11} {'tok':>4} {'main':>7} {'P8':>7} {'P16':>7}  (digits with step, us)   err P8")
for key in sorted(runs["main"]):
    r = [runs[l].get(key, {}).get("digits_us") for l in ("main", "new", "old")]
    if r[0] is None: continue
    print(f"{key[0]:<11} {key[1]:>4} " + " ".join(f"{x:>7.1f}" for x in r) + f"   {runs['new'][key].get('digits_rel_err', 0):.1e}")
PY
