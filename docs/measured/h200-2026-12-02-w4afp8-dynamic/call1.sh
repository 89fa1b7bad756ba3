# s30 call 1: the new library's kernels against their references (the dequantized forms with static and per-row
# scales, the weight-only GEMMs without their e4m3 form, the W4AFP8 runner file), then HEAD's dynamic W4AFP8 bench.
timeout 150 python -m pytest -q tests/gpu/test_fp8_quantize.py -k "dequantized" -p no:cacheprovider > $OUT/quantize.log 2>&1
echo "quantize rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/quantize.log | tail -4
timeout 150 python -m pytest -q -x tests/gpu/test_woq_gemm.py -p no:cacheprovider > $OUT/woq_gemm.log 2>&1
echo "woq_gemm rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/woq_gemm.log | tail -4
timeout 200 python -m pytest -q tests/gpu/test_runner_w4afp8.py -p no:cacheprovider > $OUT/runner.log 2>&1
echo "runner rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/runner.log | tail -6
mkdir -p /tmp/oldsrc && tar -xJf .device_carry/s30/oldsrc.tar.xz -C /tmp/oldsrc
ln -sf ../plugins /tmp/oldsrc/moe_build/plugins; ln -sf ../cpp /tmp/oldsrc/moe_build/cpp
cp .device_carry/s30/old_dynamic.py /tmp/oldsrc/
(cd /tmp/oldsrc && MOE_BUILD_KERNELS_LIB=/tmp/old/libmoe_build_kernels.so PYTHONPATH=/tmp/oldsrc timeout 260 \
  python old_dynamic.py $OUT/olddyn_r1.json 1,16,256,4096 > $OUT/olddyn.txt 2> $OUT/olddyn.log)
echo "olddyn rc=$?"; cat $OUT/olddyn.txt | tail -20
