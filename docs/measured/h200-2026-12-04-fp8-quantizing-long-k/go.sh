#!/usr/bin/env bash
# This session's device calls: unpack the carried sm_90a library (and the previous one for A/B and SASS), then
# scripts/device_run.sh with the caller's PHASES, GPU_TESTS, ... (or the caller's own command after it).
set -u
cd "$(dirname "$0")/../.."
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('.device_carry/s08/lib.tar.xz')).extractall('/tmp/lib')"
export MOE_BUILD_KERNELS_LIB=/tmp/lib/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD:$PWD/bench"
mkdir -p "$OUT"
