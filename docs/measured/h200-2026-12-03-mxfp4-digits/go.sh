#!/usr/bin/env bash
# s35 device call: unpack the new library (this tree's sources, sm_90a) and the baseline (HEAD's moe_build + its
# library), then run STEPS (scripts in this folder); everything under $OUT/r, packed into $OUT/all.tgz.
set -uo pipefail
C=.device_carry/s35
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; }
mkdir -p /tmp/new /tmp/base
[ -f /tmp/new/libmoe_build_kernels.so ] || { unxz $C/lib_new.so.xz /tmp/new/libmoe_build_kernels.so; cp $C/lib_new_build.json /tmp/new/build.json; }
[ -f /tmp/base/libmoe_build_kernels.so ] || { cp -r $C/base/moe_build $C/base/plugins $C/base/build.json /tmp/base/; unxz $C/base/lib.so.xz /tmp/base/libmoe_build_kernels.so; }
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
[ -e /tmp/base/moe_build/plugins ] || ln -s ../plugins /tmp/base/moe_build/plugins
export MOE_BUILD_KERNELS_LIB=/tmp/new/libmoe_build_kernels.so PYTHONPATH=$PWD
export R=$OUT/r; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$R/gpu.csv" 2>&1
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc took=$((SECONDS - t0))s" | tee -a "$R/steps.txt"
  tar -czf "$OUT/all.tgz" -C "$R" .
}
export -f step
for s in $STEPS; do source "$C/$s"; done
tar -czf "$OUT/all.tgz" -C "$R" .
echo "==== steps"; cat "$R/steps.txt"
