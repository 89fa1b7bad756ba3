#!/usr/bin/env bash
# s23 call 4 (one GPU): kernel timelines of graph replays at 1 token, WFP4A16 (three-step prologue, separate finalize)
# against W4A16 (fused prologue and finalize), main's tree with the nb4 library (bench/layer_timeline_probe.py taking
# weight-only layers: branch s23-mxfp4-nb4).
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s23
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
cp $C/layer_timeline_probe.py bench/layer_timeline_probe.py  # the probe as branch s23-mxfp4-nb4 commits it
export MOE_BUILD_KERNELS_LIB=/tmp/lib_nb4/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
R=$PWD; for q in wfp4a16 w4a16_awq; do
  (cd bench; PYTHONPATH=$R LAYER_TIMELINE_QUANT=$q LAYER_TIMELINE_POINTS=qwen3-30b-a3b:1,deepseek-v2-lite:1,gpt-oss-20b:1 timeout 100 \
    python3 layer_timeline_probe.py $OUT/r/timeline_$q.json > $OUT/r/timeline_$q.log 2>&1; echo "$q rc=$?")
done
tar cJf $OUT/r.tar.xz -C $OUT r
cat $OUT/r/timeline_*.log | grep -v Warning | tail -60
