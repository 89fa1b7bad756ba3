timeout 300 python bench/woq_digits_probe.py > $OUT/probe.log 2>&1
grep -v "^{" $OUT/probe.log | tail -45
