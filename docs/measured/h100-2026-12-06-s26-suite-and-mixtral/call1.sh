#!/usr/bin/env bash
# s26 call 1 (one GPU), main's library (lib_main.tar.xz: the kernels of 46d7414, where the three-step prologue's first
# launch routes, unpacking to /tmp/lib_s26): (T) every single-GPU test file, pairwise cases, eight processes (s25
# ran the new form's tests and the runner cases of the three-step prologue, one of which, test_no_allocation_per_call,
# failed on an earlier test's cyclic garbage and was changed after); (B) Mixtral-8x7B's WFP4A16 layer at 1 / 2 / 4
# tokens, the plan against routing forced separate (s25's processes ran out of time before it), two processes.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s26
mkdir -p "$OUT/r"
python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib_main.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export MOE_BUILD_KERNELS_LIB=/tmp/lib_s26/libmoe_build_kernels.so
PHASES=tests_split WORKERS_PER_GPU=8 TESTS_S=300 bash scripts/device_run.sh > $OUT/r/suite.txt 2>&1
tail -10 $OUT/r/suite.txt
export OMP_NUM_THREADS=2
for r in 1 2; do
  timeout 120 python3 -m moe_build bench --quant wfp4a16 --shapes mixtral-8x7b --tokens 1,2,4 \
    --variants ours,ours:routing=separate --iters 10 --input-sets 2 --json $OUT/r/b_$r.json > $OUT/r/b_$r.log 2>&1
  echo "round $r rc=$?"
done
tar cJf $OUT/r.tar.xz -C $OUT r
python3 - $OUT/r <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("b_*.json")):
    for p in json.loads(f.read_text())["points"]:
        v = p["variants"]
        print(f.name, p["shape"], p["tokens"], round(v["ours"]["graph_us"], 1), round(v["ours:routing=separate"]["graph_us"], 1),
              round(v["ours"]["graph_rel_err"], 4))
PY
