#!/usr/bin/env bash
# s24 call 3 (one GPU): call 2 had per-row W4AFP8 (w4afp8_dynamic) on Qwen3-30B-A3B at 1 token 1.131x slower in graph
# replay with lib_early, though that layer runs no kernel the change touched (its eager calls 0.99x): three rounds of
# main against early on it and W4A16 GPT-OSS-20B (at its target's line), then each library's kernel timeline of the
# per-row layer (bench/layer_timeline_probe.py taking the bench's mode names).
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s24
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs2.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LM=/tmp/lib_main/libmoe_build_kernels.so; LE=/tmp/lib_early/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS; timeout 300 python3 bench/lib_ab.py --libs main=$LM,early=$LE --rounds 3 --out $OUT/r/ab --timeout 60 -- \
  --quant w4afp8_dynamic,w4a16_awq --shapes qwen3-30b-a3b,gpt-oss-20b,deepseek-v2-lite --tokens 1 \
  --variants ours --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"
tar cJf $OUT/r.tar.xz -C $OUT r
R=$PWD; for lib in main early; do
  (cd bench; PYTHONPATH=$R MOE_BUILD_KERNELS_LIB=/tmp/lib_$lib/libmoe_build_kernels.so LAYER_TIMELINE_QUANT=w4afp8_dynamic \
    LAYER_TIMELINE_POINTS=qwen3-30b-a3b:1 timeout 60 python3 layer_timeline_probe.py $OUT/r/timeline_$lib.json \
    > $OUT/r/timeline_$lib.log 2>&1; echo "timeline $lib rc=$?")
done
tar cJf $OUT/r.tar.xz -C $OUT r
cat $OUT/r/ab.txt; grep -hv Warn $OUT/r/timeline_*.log | grep -v _warn
