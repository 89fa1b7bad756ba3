#!/usr/bin/env bash
# s21 call 1 (H100): where the MXFP4 digits GEMM's time goes beside int4's (ncu), and the probes at 1/16 tokens.
set -u
cd "$(dirname "$0")/../.."
mkdir -p /tmp/lib_main "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s21/lib_main.tar.xz /tmp/lib_main
export MOE_BUILD_KERNELS_LIB=/tmp/lib_main/libmoe_build_kernels.so PYTHONPATH="$PWD:$PWD/bench"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv; which ncu >> $OUT/r/gpu.csv
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats --section Occupancy --section LaunchStats"
for spec in "mxfp4 mixtral_g1 1 1" "int4 mixtral_g1 1 1" "mxfp4 gptoss_g1 1 1" "int4 gptoss_g1 1 1" "mxfp4 mixtral_g1 16 1" "int4 mixtral_g1 16 1" "mxfp4 qwen3_g1 16 1"; do
  set -- $spec
  timeout 60 ncu --clock-control none -k regex:woq_decode_digits_kernel --launch-skip 2 -c 1 $S \
    python3 .device_carry/s21/ncu_one.py $spec > $OUT/r/ncu_${1}_${2}_${3}.txt 2>&1; echo "ncu $spec rc=$?"
done
timeout 60 ncu --clock-control none -k regex:woq_decode_digits_kernel --launch-skip 2 -c 1 --set full --import-source no -o $OUT/r/full_mxfp4_mixtral1 \
    python3 .device_carry/s21/ncu_one.py mxfp4 mixtral_g1 1 1 > $OUT/r/ncu_full.log 2>&1; echo "full rc=$?"
ncu --import $OUT/r/full_mxfp4_mixtral1.ncu-rep --page details > $OUT/r/full_mxfp4_mixtral1.txt 2>&1
ncu --import $OUT/r/full_mxfp4_mixtral1.ncu-rep --page source --print-source sass --csv > $OUT/r/full_mxfp4_mixtral1_sass.csv 2>&1; echo "sass rc=$?"
t0=$SECONDS; OUT=$OUT/r WOQ_DIGITS_KIND=mxfp4 WOQ_DIGITS_TOKENS=1,16 WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_GEMMS=mixtral_g1,mixtral_g2,gptoss_g1,gptoss_g2,qwen3_g1,qwen3_g2 \
  timeout 120 python3 bench/woq_digits_probe.py > $OUT/r/mxfp4_probe.log 2>&1; echo "mxfp4 probe rc=$? $((SECONDS-t0))s"
tail -14 $OUT/r/mxfp4_probe.log
for f in $OUT/r/ncu_*.txt; do echo "== $f"; grep -E 'Duration|Issue Slots Busy|Memory Throughput|DRAM Throughput|L1/TEX Hit|Executed Ipc Active|Warp Cycles Per Issued|Achieved Occupancy|No Eligible|Stall' $f | head -12; done
