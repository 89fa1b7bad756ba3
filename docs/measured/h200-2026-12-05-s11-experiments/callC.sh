# Device call 4 of session s11's prepared experiments: qt = branch mxfp4-digits-quad-transpose-experiment (MXFP4 on the
# digits tile: one 16-byte load a row and group, lane q its quarter q, then a 4 x 4 word transpose across each lane
# quad, where it took four 4-byte loads). Its digits GEMM tests; the MXFP4 GEMMs alone on main's and qt's libraries;
# WFP4A16 layers on both; about 8 minutes on an H200.
source .device_carry/s11/go.sh
mkdir -p $OUT/r
H=/tmp/head/libmoe_build_kernels.so; QT=/tmp/qt/libmoe_build_kernels.so
MOE_BUILD_KERNELS_LIB=$QT timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_woq_gemm.py -k "digits and mxfp4" > $OUT/r/gpu_qt.log 2>&1; echo "gpu qt rc=$?"; tail -2 $OUT/r/gpu_qt.log | cut -c1-300
for L in head qt; do mkdir -p $OUT/r/probe_$L
  MOE_BUILD_KERNELS_LIB=/tmp/$L/libmoe_build_kernels.so WOQ_DIGITS_KIND=mxfp4 WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_TOKENS=1,16 WOQ_DIGITS_GEMMS=qwen3_g1,qwen3_g2,gptoss_g1,gptoss_g2 OUT=$OUT/r/probe_$L \
    timeout 70 python3 bench/woq_digits_probe.py > $OUT/r/probe_$L.log 2>&1; echo "probe $L rc=$?"
done
timeout 200 python3 bench/lib_ab.py --libs head=$H,qt=$QT --rounds 2 --out $OUT/r/ab_wfp4 -- --quant wfp4a16 \
  --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16 --variants ours --iters 10 --input-sets 2 > $OUT/r/ab_wfp4.log 2>&1; echo "ab wfp4 rc=$?"
tar czf $OUT/results.tgz -C $OUT r
for L in head qt; do echo "== $L"; tail -10 $OUT/r/probe_$L.log | cut -c1-170; done
tail -9 $OUT/r/ab_wfp4.log | cut -c1-200
