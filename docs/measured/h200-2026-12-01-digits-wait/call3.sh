# s22 call 3: the ring kernel with two CTAs an SM (lib_new = lib_s22c), the probe at the planner's split.
mkdir -p $OUT/probe_c
WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,2,4,16 OUT=$OUT/probe_c timeout 200 python bench/woq_digits_probe.py > $OUT/probe_c.log 2>&1 || echo "probe failed"
grep "^{" $OUT/probe_c.log | python -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l)
    print(r['gemm'], r['tokens'], 'staged', r['staged_us'], 'digits', r.get('digits_us'), 'gemm', r.get('digits_gemm_us'), 'err', r.get('digits_rel_err'))
"
