#!/usr/bin/env bash
# s33 device wrapper: unpack the carried library (and an old one if carried) and run $STEPS; logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p /tmp/main /tmp/old
tar -xJf .device_carry/s33/lib_main.tar.xz -C /tmp/main
[ -f .device_carry/s33/lib_old.tar.xz ] && tar -xJf .device_carry/s33/lib_old.tar.xz -C /tmp/old
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MOE_BUILD_KERNELS_LIB=/tmp/main/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.csv 2>&1
bash -c "$STEPS" > $OUT/steps.log 2>&1
echo "steps rc=$?" >> $OUT/steps.log
tar -czf $OUT/all.tgz -C $OUT --exclude all.tgz . 2>/dev/null
tail -n ${TAIL:-40} $OUT/steps.log
