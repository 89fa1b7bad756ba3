#!/usr/bin/env bash
# s23 call 3 (one GPU, the machine of call 2): the weight-only GPU tests that run the MXFP4 digits kernel and the
# runner's stored operands, on main's tree (1cf6b03) with the nb4 library, eight processes; each stopped at 230 s
# (shards 1-3 had run 20 / 18 / 18 of about 22 cases, none failed; shard 7's log did not come back, its tail said
# "22 passed").
C=.device_carry/s23
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
mkdir -p $OUT/r
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=/tmp/lib_nb4/libmoe_build_kernels.so timeout 230 python3 -m pytest -q -rs \
  -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py -k "mxfp4 or wfp4a16 or stored or digits" \
  --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
