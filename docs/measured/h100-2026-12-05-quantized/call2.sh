# s16 calls 2-3: FP8 and weight-only layers on an H100 (never benched there): ours beside our bf16 layer and the floor.
set -u
mkdir -p /tmp/head && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s14/head.tar.xz /tmp/head
export MOE_BUILD_KERNELS_LIB=/tmp/head/libmoe_build_kernels.so
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="$PWD"
D=$(mktemp -d); mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv > $D/gpu.csv
QUANTS=${QUANTS:-fp8 wfp4a16 w4a16_awq fp8_block w4afp8}
for q in $QUANTS; do
  t0=$SECONDS
  timeout ${Q_S:-170} python3 -m moe_build bench --quant $q --variants ours,ours_bf16 --iters 5 --input-sets 2 \
    --json $D/bench_$q.json > $D/bench_$q.log 2>&1
  echo "$q rc=$? $((SECONDS-t0))s" | tee -a $D/phases.txt
  tar -czf $OUT/bench.tgz -C $D .
done
for q in $QUANTS; do echo "== $q"; grep -A26 "^quant " $D/bench_$q.log | cut -c1-200; done
