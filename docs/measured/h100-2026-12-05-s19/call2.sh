# s19 call 2: the FP8 static-scale, W8A16 and per-row W4AFP8 layers on an H100 (benched only on H200s so far): ours
# beside our bf16 layer and the floor, main's library (3e246ac's C++), each mode a process of its own.
set -u
source .device_carry/s19/go.sh
export MOE_BUILD_KERNELS_LIB=/tmp/lib_head/libmoe_build_kernels.so
export PYTHONPATH="$PWD"
D=$(mktemp -d); mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv > $D/gpu.csv
for q in ${QUANTS:-fp8_static w8a16 w4afp8_dynamic}; do
  t0=$SECONDS
  timeout ${Q_S:-185} python3 -m moe_build bench --quant $q --variants ours,ours_bf16 --iters 5 --input-sets 2 \
    --json $D/bench_$q.json > $D/bench_$q.log 2>&1
  echo "$q rc=$? $((SECONDS-t0))s" | tee -a $D/phases.txt
  tar -czf $OUT/bench.tgz -C $D .
done
for q in ${QUANTS:-fp8_static w8a16 w4afp8_dynamic}; do echo "== $q"; grep -A26 "^quant " $D/bench_$q.log | cut -c1-150; done
