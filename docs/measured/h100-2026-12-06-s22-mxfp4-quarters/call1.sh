#!/usr/bin/env bash
# s22 call 1 (one GPU): GPU tests of the quarters form (branch s21-mxfp4-quarters); the MXFP4 digits GEMMs of main,
# quarters and quarters with four groups a wait (nb4); WFP4A16 layers of the three through lib_ab, one round.
set -u
cd "$(dirname "$0")/../.."
R=$PWD; C=$R/.device_carry/s22; B=$C/base
mkdir -p "$OUT/r/q" "$OUT/r/q2" "$OUT/r/m"
for l in main q q2; do mkdir -p /tmp/lib_$l; python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib_$l.tar.xz /tmp/lib_$l; done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
[ -e $B/moe_build/plugins ] || ln -s ../plugins $B/moe_build/plugins
LQ=/tmp/lib_q/libmoe_build_kernels.so; LQ2=/tmp/lib_q2/libmoe_build_kernels.so; LM=/tmp/lib_main/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
t0=$SECONDS; MOE_BUILD_KERNELS_LIB=$LQ timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py \
  -k "mxfp4 or digits_finalize or refusal or forms" > $OUT/r/tests_q.log 2>&1; echo "tests q rc=$? $((SECONDS-t0))s"; tail -3 $OUT/r/tests_q.log
G=mixtral_g1,mixtral_g2,gptoss_g1,gptoss_g2,qwen3_g1,qwen3_g2
for v in q q2; do t0=$SECONDS; MOE_BUILD_KERNELS_LIB=/tmp/lib_$v/libmoe_build_kernels.so PYTHONPATH="$R:$R/bench" OUT=$OUT/r/$v WOQ_DIGITS_KIND=mxfp4 WOQ_DIGITS_TOKENS=1,16 WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_GEMMS=$G \
  timeout 40 python3 bench/woq_digits_probe.py > $OUT/r/probe_$v.log 2>&1; echo "probe $v rc=$? $((SECONDS-t0))s"; done
cd $B; t0=$SECONDS; MOE_BUILD_KERNELS_LIB=$LM PYTHONPATH="$B:$B/bench" OUT=$OUT/r/m WOQ_DIGITS_KIND=mxfp4 WOQ_DIGITS_TOKENS=1,16 WOQ_DIGITS_KSPLITS=1 WOQ_DIGITS_GEMMS=$G \
  timeout 40 python3 bench/woq_digits_probe.py > $OUT/r/probe_m.log 2>&1; echo "probe main rc=$? $((SECONDS-t0))s"; cd $R
for v in m q q2; do echo "== probe $v"; tail -13 $OUT/r/probe_$v.log; done
t0=$SECONDS; timeout 250 python3 bench/lib_ab.py --libs main=$LM@$B,quarters=$LQ,nb4=$LQ2 --rounds 1 --out $OUT/r/ab --timeout 80 -- \
  --quant wfp4a16 --shapes mixtral-8x7b,qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/ab.err
t0=$SECONDS; MOE_BUILD_KERNELS_LIB=$LQ2 timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py \
  -k "mxfp4 or digits_finalize" > $OUT/r/tests_q2.log 2>&1; echo "tests q2 rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/tests_q2.log
python3 - $OUT/r/ab <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/quarters_*.json"))[-1:]:
    for p in json.load(open(f))["points"]:
        v = p["variants"]["ours"]
        print(p["shape"], p["tokens"], "floor", round(p["floor_us"], 1), "ours", round(v["graph_us"], 1),
              "x", round(v["graph_us"] / p["floor_us"], 3), v["plan"]["gemm1_tactic"], v["plan"]["gemm2_tactic"])
PY
cat $OUT/r/ab.txt
