#!/usr/bin/env bash
# s22 call 3 (one GPU): GPT-OSS-20B's MXFP4 digits GEMMs slower in the quarters form at 2+ tokens (calls 1-2): the
# quarters form padded to whole 128-k groups (padded/: branch s22-mxfp4-padded at 2dfa8c3, its library lib_p) under
# the GPU tests and on GPT-OSS-20B's WFP4A16 layer against main and the unpadded form (nb4: branch
# s21-mxfp4-nb4-experiment's tree and library), lib_ab, two rounds; the GEMM at K 2880 and 2944 in the stored and the
# unpadded quarters form, L2 emptied first (kshape.py); main against padded on two more layers, one round.
set -u
cd "$(dirname "$0")/../.."
R=$PWD; C=$R/.device_carry/s22; B=$C/base; P=$C/padded
mkdir -p "$OUT/r"
for l in main q2 p; do mkdir -p /tmp/lib_$l; python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib_$l.tar.xz /tmp/lib_$l; done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
for t in $B $P; do [ -e $t/moe_build/plugins ] || ln -s ../plugins $t/moe_build/plugins; done
LQ2=/tmp/lib_q2/libmoe_build_kernels.so; LP=/tmp/lib_p/libmoe_build_kernels.so; LM=/tmp/lib_main/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv
(cd $P; t0=$SECONDS; MOE_BUILD_KERNELS_LIB=$LP timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py \
  -k "mxfp4 or digits_finalize or forms" > $OUT/r/tests_padded.log 2>&1; echo "tests padded rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/tests_padded.log)
t0=$SECONDS; timeout 220 python3 bench/lib_ab.py --libs main=$LM@$B,nb4=$LQ2,padded=$LP@$P --rounds 2 --out $OUT/r/ab --timeout 35 -- \
  --quant wfp4a16 --shapes gpt-oss-20b --tokens 1,2,4,16 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -2 $OUT/r/ab.err
cat $OUT/r/ab.txt
(cd $B; MOE_BUILD_KERNELS_LIB=$LM PYTHONPATH=$B timeout 60 python3 $C/kshape.py stored $OUT/r/kshape_stored.json > $OUT/r/kshape_stored.log 2>&1; echo "kshape stored rc=$?")
MOE_BUILD_KERNELS_LIB=$LQ2 PYTHONPATH=$R timeout 60 python3 $C/kshape.py quarters $OUT/r/kshape_quarters.json > $OUT/r/kshape_quarters.log 2>&1; echo "kshape quarters rc=$?"
paste $OUT/r/kshape_stored.log $OUT/r/kshape_quarters.log
t0=$SECONDS; timeout 90 python3 bench/lib_ab.py --libs main=$LM@$B,padded=$LP@$P --rounds 1 --out $OUT/r/ab2 --timeout 40 -- \
  --quant wfp4a16 --shapes mixtral-8x7b,deepseek-v2-lite --tokens 1,16 --variants ours --iters 10 --input-sets 2 \
  > $OUT/r/ab2.txt 2> $OUT/r/ab2.err; echo "ab2 rc=$? $((SECONDS-t0))s"; tail -1 $OUT/r/ab2.err
cat $OUT/r/ab2.txt
