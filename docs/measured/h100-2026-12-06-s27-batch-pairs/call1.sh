#!/usr/bin/env bash
# s27 call 1 (one GPU): the digits kernels with their big batches taken in pairs (branch s27-batch-pairs, the
# first two big batches issued before the predecessor's wait, one wait per pair) against main's library
# (lib_main: c7eecd3's kernels = 46d7414's), and lib_s27f (pairs in the digits bodies of 1-2 mmas only, the old
# schedule in those of 3-4, whose spills pairs raised; the staged int4 decode kernel's big batches in pairs):
# (T) the digits and staged GEMM tests and the weight-only runner's digits and staged cases on lib_s27f; (B) W4A16 layers at 1 / 16 tokens, bench/lib_ab.py, two rounds; (C) lib_s27f against main on
# Mixtral-8x7B at 1 / 16 tokens (GEMM1 on the staged tile at 16).
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s27
mkdir -p "$OUT/r"
for t in lib_main lib_s27f; do
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/$t.tar.xz /tmp
done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
LM=/tmp/lib_s26/libmoe_build_kernels.so; LC=/tmp/lib_s27f/libmoe_build_kernels.so
ls -la $LM $LC
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/r/gpu.csv; cat $OUT/r/gpu.csv
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do MOE_BUILD_KERNELS_LIB=$LC timeout 45 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/gpu/test_woq_gemm.py tests/gpu/test_runner_woq.py -k "digits or staged" --shard=$p/8 > $OUT/r/t_$p.log 2>&1 & done; wait
echo "tests $((SECONDS-t0))s"; for f in $OUT/r/t_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
grep -h "^FAILED\|Error:" $OUT/r/t_*.log | head -10
t0=$SECONDS; timeout 140 python3 bench/lib_ab.py --libs main=$LM,pairs=$LC --rounds 2 --out $OUT/r/ab --timeout 34 -- \
  --quant w4a16_awq --shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b --tokens 1,16 --variants ours \
  --iters 10 --input-sets 2 > $OUT/r/ab.txt 2> $OUT/r/ab.err; echo "ab rc=$? $((SECONDS-t0))s"; tail -3 $OUT/r/ab.err
cat $OUT/r/ab.txt
t0=$SECONDS; timeout 130 python3 bench/lib_ab.py --libs main=$LM,staged=$LC --rounds 2 --out $OUT/r/abm --timeout 32 -- \
  --quant w4a16_awq --shapes mixtral-8x7b --tokens 1,16 --variants ours \
  --iters 10 --input-sets 2 > $OUT/r/abm.txt 2> $OUT/r/abm.err; echo "abm rc=$? $((SECONDS-t0))s"; tail -3 $OUT/r/abm.err
python3 - $OUT/r/ab $OUT/r/abm <<'PY'
import json, pathlib, sys
for d in sys.argv[1:]:
    for f in sorted(pathlib.Path(d).glob("*.json")):
        if f.name == "summary.json": continue
        errs = [v.get("graph_rel_err") for p in json.loads(f.read_text())["points"] for v in p["variants"].values()]
        print(f.name, "largest graph_rel_err", max((e for e in errs if e is not None), default=None))
PY
tar cJf $OUT/r.tar.xz -C $OUT r
cat $OUT/r/abm.txt
