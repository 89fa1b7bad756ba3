#!/usr/bin/env bash
# s25 call 4 (one GPU), main's library (lib_main). Calls 1 and 3 ran eight pytest processes without OMP_NUM_THREADS:
# their fp64 references on the CPU starved each other (stacks in moe_build/weights/woq.py past 50-80 s), as
# scripts/device_run.sh's tests_split phase warns. Again with OMP_NUM_THREADS=2: (W) W4AFP8's digits runner cases,
# (A) the weight-only runner cases call 1 did not pass, then call2.sh's GPT-OSS-20B K-split probe, two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s25
mkdir -p "$OUT/r"
[ -e /tmp/lib_main ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/libs.tar.xz /tmp
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export MOE_BUILD_KERNELS_LIB=/tmp/lib_main/libmoe_build_kernels.so OMP_NUM_THREADS=2
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do timeout 80 python3 -m pytest -v -rs -p no:cacheprovider -o faulthandler_timeout=60 \
  tests/gpu/test_runner_w4afp8.py -k digits --shard=$p/8 > $OUT/r/tw_$p.log 2>&1 & done; wait
echo "tests W $((SECONDS-t0))s"; for f in $OUT/r/tw_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
t0=$SECONDS
for p in 0 1 2 3 4 5 6 7; do timeout 190 python3 -m pytest -v -rs -p no:cacheprovider -o faulthandler_timeout=100 \
  $(cat $C/rest/woq_$p.txt) > $OUT/r/ta_$p.log 2>&1 & done; wait
echo "tests A $((SECONDS-t0))s"; for f in $OUT/r/ta_*.log; do echo "$(basename $f) $(tail -1 $f)"; done
grep -h "FAILED\|Timeout\|Error" $OUT/r/t*.log | head -8
tar cJf $OUT/r.tar.xz -C $OUT r
V="ours,ours:gemm1_tactic=decode:digits_ksplit2:after_trigger:plain"
V="$V,ours:gemm2_tactic=decode:digits_ksplit1:after_trigger:plain,ours:gemm2_tactic=decode:digits_ksplit4:after_trigger:plain"
for r in 1 2; do
  timeout 90 python3 -m moe_build bench --quant w4a16_awq,w8a16,w4afp8 --shapes gpt-oss-20b --tokens 1 --variants "$V" \
    --iters 10 --input-sets 2 --json $OUT/r/splits_$r.json > $OUT/r/splits_$r.log 2>&1; echo "round $r rc=$?"
done
tar cJf $OUT/r.tar.xz -C $OUT r
python3 - $OUT/r <<'PY'
import json, pathlib, re, sys
d = pathlib.Path(sys.argv[1])
for f in sorted(d.glob("splits_*.json")):
    for p in json.loads(f.read_text())["points"]:
        cells = [re.sub(r".*(gemm[12]).*(ksplit[0-9]).*", r"\1_\2", k) + "=%.1f" % v.get("graph_us", 0)
                 for k, v in p["variants"].items()]
        print(f.name, p["quant"], " ".join(cells))
PY
