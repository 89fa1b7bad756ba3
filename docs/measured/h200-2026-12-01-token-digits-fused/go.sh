#!/bin/bash
# s23 device entry: unpack the carried kernel libraries, run $STEPS, pack $OUT into all.tgz.
set -u
for t in main new old; do
  f=.device_carry/s23/lib_$t.tar.xz
  if [ -f "$f" ]; then mkdir -p /tmp/$t && tar -xJf "$f" -C /tmp/$t; fi
done
export MOE_BUILD_KERNELS_LIB=${LIB:-/tmp/main/libmoe_build_kernels.so}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
[ -e moe_build/cpp ] || ln -s ../cpp moe_build/cpp
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
bash -c "$STEPS" > $OUT/steps.log 2>&1
echo "steps rc=$?"
tail -n ${TAIL:-40} $OUT/steps.log
tar -czf /tmp/all.tgz -C $OUT . && mv /tmp/all.tgz $OUT/all.tgz
