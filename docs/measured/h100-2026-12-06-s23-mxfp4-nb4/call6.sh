#!/usr/bin/env bash
# s23 call 6 (one GPU, the machine of call 5): the runner's WFP4A16 GPU tests with the rule's library (call 5's
# libs5.tar.xz: main's library and the rule's), eight processes, each stopped at 170 s (shards 0 and 1 had run 5 and 4
# cases, none failed; shard 7's log did not come back, its tail said "4 passed, 2 skipped").
C=.device_carry/s23
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs5.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
mkdir -p $OUT/r
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=/tmp/lib_rule/libmoe_build_kernels.so timeout 170 python3 -m pytest -q -rs \
  -p no:cacheprovider tests/gpu/test_runner_woq.py -k "wfp4a16 or mxfp4" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
tar cJf $OUT/t.tar.xz -C $OUT r
