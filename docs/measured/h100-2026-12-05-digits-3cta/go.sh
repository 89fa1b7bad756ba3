#!/usr/bin/env bash
# Session s17's device calls: unpack the carried sm_90a libraries (head = main's C++, others = experiment builds).
set -u
cd "$(dirname "$0")/../.."
for f in .device_carry/s17/*.tar.xz; do
  n=$(basename $f .tar.xz); mkdir -p /tmp/$n
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $f /tmp/$n
done
export MOE_BUILD_KERNELS_LIB=/tmp/head/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p "$OUT"
