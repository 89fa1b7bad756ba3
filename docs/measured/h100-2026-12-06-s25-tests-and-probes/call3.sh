#!/usr/bin/env bash
# s25 call 3 (one GPU), main's library (lib_main): (B) W4AFP8's digits runner cases, verbose, a stack dump past 50 s
# per test (call 1's eight shards printed nothing in 70 s); (A) the weight-only runner cases call 1 did not reach in
# 150 s (rest/woq_P.txt: shard P's node ids past the ones it passed).
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s25
mkdir -p "$OUT/r"
[ -e /tmp/lib_main ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export MOE_BUILD_KERNELS_LIB=/tmp/lib_main/libmoe_build_kernels.so
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do timeout 130 python3 -m pytest -v -rs -p no:cacheprovider -o faulthandler_timeout=50 \
  tests/gpu/test_runner_w4afp8.py -k digits --shard=$p/8 > $OUT/r/tw_$p.log 2>&1 & done; wait
echo "tests W $((SECONDS-t0))s"; for f in $OUT/r/tw_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
tar cJf $OUT/r.tar.xz -C $OUT r
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do timeout 250 python3 -m pytest -v -rs -p no:cacheprovider -o faulthandler_timeout=80 \
  $(cat $C/rest/woq_$p.txt) > $OUT/r/ta_$p.log 2>&1 & done; wait
echo "tests A $((SECONDS-t0))s"; for f in $OUT/r/ta_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
grep -h "FAILED\|Timeout\|Error" $OUT/r/t*.log | head -8
tar cJf $OUT/r.tar.xz -C $OUT r
