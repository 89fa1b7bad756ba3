#!/usr/bin/env bash
# s22 call 2 (one GPU): why GPT-OSS-20B's MXFP4 digits GEMMs at 16 tokens run slower in the quarters form (probe over
# tokens, ncu of GEMM1 at 16 tokens both forms); the MXFP4 digits band on the quarters form (plan to 1 average row an
# expert on 64+ experts against int4's 3, band/), WFP4A16 layers, lib_ab, two rounds.
set -u
cd "$(dirname "$0")/../.."
R=$PWD; C=$R/.device_carry/s22; B=$C/base
mkdir -p "$OUT/r/q" "$OUT/r/q2" "$OUT/r/m"
for l in main q q2; do mkdir -p /tmp/lib_$l; python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib_$l.tar.xz /tmp/lib_$l; done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
for t in $B $C/band; do [ -e $t/moe_build/plugins ] || ln -s ../plugins $t/moe_build/plugins; done
LQ=/tmp/lib_q/libmoe_build_kernels.so; LM=/tmp/lib_main/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
G=gptoss_g1,gptoss_g2,mixtral_g1
for v in q q2; do MOE_BUILD_KERNELS_LIB=/tmp/lib_$v/libmoe_build_kernels.so PYTHONPATH="$R:$R/bench" OUT=$OUT/r/$v WOQ_DIGITS_KIND=mxfp4 WOQ_DIGITS_TOKENS=1,2,4,8,12,16 WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_GEMMS=$G \
  timeout 40 python3 bench/woq_digits_probe.py > $OUT/r/probe_$v.log 2>&1; echo "probe $v rc=$?"; done
(cd $B; MOE_BUILD_KERNELS_LIB=$LM PYTHONPATH="$B:$B/bench" OUT=$OUT/r/m WOQ_DIGITS_KIND=mxfp4 WOQ_DIGITS_TOKENS=1,2,4,8,12,16 WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_GEMMS=$G \
  timeout 40 python3 bench/woq_digits_probe.py > $OUT/r/probe_m.log 2>&1; echo "probe main rc=$?")
paste $OUT/r/probe_m.log $OUT/r/probe_q.log $OUT/r/probe_q2.log | tail -19
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats --section Occupancy"
for f in stored quarters; do
  if [ $f = stored ]; then L=$LM; P=$B; else L=$LQ; P=$R; fi
  MOE_BUILD_KERNELS_LIB=$L PYTHONPATH=$P timeout 60 ncu --clock-control none -k regex:woq_decode_digits_kernel --launch-skip 2 -c 1 $S \
    python3 $C/ncu_g.py $f gptoss_g1 16 1 > $OUT/r/ncu_${f}_gptoss_g1_16.txt 2>&1; echo "ncu $f rc=$?"
  MOE_BUILD_KERNELS_LIB=$L PYTHONPATH=$P timeout 80 ncu --clock-control none -k regex:woq_decode_digits_kernel --launch-skip 2 -c 1 --set full --import-source no -o $OUT/r/full_${f} \
    python3 $C/ncu_g.py $f gptoss_g1 16 1 > $OUT/r/full_${f}.log 2>&1; echo "full $f rc=$?"
  ncu --import $OUT/r/full_${f}.ncu-rep --page source --print-source sass --csv > $OUT/r/full_${f}_sass.csv 2>&1
  python3 $C/sass_ops.py $OUT/r/full_${f}_sass.csv > $OUT/r/ops_${f}.txt 2>&1; xz -9 $OUT/r/full_${f}_sass.csv; rm -f $OUT/r/full_${f}.ncu-rep
done
for f in $OUT/r/ncu_*.txt; do echo "== $f"; grep -E 'Duration|Issue Slots Busy|DRAM Throughput|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued|Achieved Occupancy|Executed Instructions  |Registers Per' $f | head -12; done
t0=$SECONDS; timeout 250 python3 bench/lib_ab.py --libs quarters=$LQ,band=$LQ@$C/band --rounds 2 --out $OUT/r/band --timeout 60 -- \
  --quant wfp4a16 --shapes qwen3-30b-a3b,deepseek-v2-lite --tokens 1,2,4,8,12,16,24,32 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/band.txt 2> $OUT/r/band.err; echo "band rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/band.err
cat $OUT/r/band.txt; paste $OUT/r/ops_stored.txt $OUT/r/ops_quarters.txt | head -24
