NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
# the FP8 layer's third call: its GEMM2 (the 2x1-cluster finalize tile) and GEMM1; stall reasons and source counters
$NCU --kernel-name regex:device_kernel --launch-skip 4 --launch-count 2 --section WarpStateStats --section SourceCounters \
  --section SpeedOfLight --print-details all --metrics smsp__pcsamp_sample_count,group:smsp__pcsamp_warp_stall_reasons \
  -o $OUT/gemms python .device_carry/s14/ncu_layers.py > $OUT/ncu2_raw.txt 2>&1
$NCU -i $OUT/gemms.ncu-rep --print-details all --page details > $OUT/ncu2_details.txt 2>&1
$NCU -i $OUT/gemms.ncu-rep --page raw --csv --metrics regex:smsp__pcsamp_warps_issue_stalled_.* > $OUT/ncu2_stalls.csv 2>&1
$NCU -i $OUT/gemms.ncu-rep --page source --csv --print-source sass > $OUT/ncu2_source.csv 2>&1
gzip -f $OUT/ncu2_source.csv; rm -f $OUT/gemms.ncu-rep; ls -la $OUT; tail -3 $OUT/ncu2_raw.txt; head -c 3000 $OUT/ncu2_stalls.csv
