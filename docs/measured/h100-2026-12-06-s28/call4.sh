#!/usr/bin/env bash
# s28 call 4: FP8 block-128, both GEMMs forced onto the two-CTA decode tile past the 64-row band, two rounds.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s28
mkdir -p "$OUT/r" /tmp/libs
[ -d /tmp/libs/lib_main ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib_main.tar.xz /tmp/libs
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib_main/libmoe_build_kernels.so
D1=decode:twocta_ksplit1:after_trigger:plain
for round in 1 2; do
  for pt in "qwen3-30b-a3b 8,12,16,24,32,48" "deepseek-v2-lite 8,12,16,24,32" "gpt-oss-20b 16,24,32"; do
    set -- $pt; t0=$SECONDS
    timeout 100 python3 -m moe_build bench --quant fp8_block --shapes $1 --tokens $2 --variants "ours,ours:gemm1_tactic=$D1+gemm2_tactic=$D1" \
      --iters 10 --input-sets 2 --json $OUT/r/band_${1}_r$round.json > $OUT/r/band_${1}_r$round.log 2>&1
    echo "$1 r$round rc=$? $((SECONDS-t0))s"
  done
  tar cJf $OUT/r.tar.xz -C $OUT r
done
python3 - $OUT/r <<'PY'
import json, pathlib, sys
rows = {}
for f in sorted(pathlib.Path(sys.argv[1]).glob("band_*.json")):
    for p in json.loads(f.read_text())["points"]:
        for v, e in p["variants"].items():
            rows.setdefault((p["shape"], p["tokens"], v[:12]), []).append(e.get("graph_us"))
for (s, t, v), xs in sorted(rows.items()):
    print(f"{s:18s} {t:4d} {v:14s} " + " ".join(f"{u:.1f}" if u else "-" for u in xs))
PY
