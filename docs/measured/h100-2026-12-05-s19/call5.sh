# s19 call 5: the product library (int8 on the digits tile) built from this tree, its GPU tests: the int8 digits
# kernel at every combination, then the weight-only GEMM, token-digits and runner files in four processes.
set -u
cd "$(dirname "$0")/../.."
mkdir -p /tmp/lib && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s19/lib_final.tar.xz /tmp/lib
export MOE_BUILD_KERNELS_LIB=/tmp/lib/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
mkdir -p $OUT/t
t0=$SECONDS; timeout 100 python3 -m pytest -q -p no:cacheprovider --gpu-cases=all tests/gpu/test_woq_gemm.py -k "int8_digits or digits_finalize" > $OUT/t/int8_all.log 2>&1; echo "int8 all rc=$? $((SECONDS-t0))s"; tail -1 $OUT/t/int8_all.log
t0=$SECONDS
for i in 0 1 2 3; do
  OMP_NUM_THREADS=4 timeout 200 python3 -m pytest -q -p no:cacheprovider --shard $i/4 tests/gpu/test_woq_gemm.py \
    tests/gpu/test_token_digits.py tests/gpu/test_runner_woq.py tests/gpu/test_runner_w4afp8.py > $OUT/t/shard$i.log 2>&1 &
done; wait; echo "shards $((SECONDS-t0))s"
for i in 0 1 2 3; do tail -1 $OUT/t/shard$i.log; done
tar czf $OUT/tests5.tgz -C $OUT t
