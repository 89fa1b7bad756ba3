#!/usr/bin/env bash
# s29 call 1 (one GPU), this branch's library (main + FP8 pingpong 64x256 tiles, fast accumulation):
# (F) FP8 rowwise layers at 4096 tokens with either GEMM forced onto pingpong64x256 / pingpong64x256c2, beside the plan
# and our bf16 layer; (B) block-128 in the wide band: on an H200 (where this call ran) the decode tile forced beside the
# plan's wgmma tiles, on an H100 the band's untimed points beside the H200 plan's tactics; (T) the FP8 GEMM tests of the
# new tiles. Run as .device_carry/s29/call1.sh (the library beside it as lib.tar.xz), through the device tool.
set -u
cd "$(dirname "$0")/../.."
C=$PWD/.device_carry/s29
mkdir -p "$OUT/r" /tmp/libs
[ -d /tmp/libs/lib ] || python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $C/lib.tar.xz /tmp/libs
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH=$PWD MOE_BUILD_KERNELS_LIB=/tmp/libs/lib/libmoe_build_kernels.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $OUT/r/gpu.csv; cat $OUT/r/gpu.csv
G1=wgmma:pingpong64x256; G2=wgmma:pingpong64x256
V="ours,ours:gemm1_tactic=$G1:plain:evict_last,ours:gemm1_tactic=${G1}c2:plain:evict_last"
V="$V,ours:gemm2_tactic=$G2:plain:evict_last,ours:gemm2_tactic=${G2}c2:plain:evict_last,ours_bf16"
for sh in ${FP8_SHAPES:-qwen3-30b-a3b gpt-oss-20b deepseek-v2-lite mixtral-8x7b}; do
  t0=$SECONDS
  timeout ${FP8_S:-80} python3 -m moe_build bench --quant fp8 --shapes $sh --tokens ${FP8_TOKENS:-4096} --variants "$V" \
    --iters 5 --input-sets 2 --json $OUT/r/pp_${sh}.json > $OUT/r/pp_${sh}.log 2>&1
  echo "pp $sh rc=$? $((SECONDS-t0))s"
done
tar cJf $OUT/r.tar.xz -C $OUT r
OLD1=wgmma:pingpong64x128:plain:plain; OLD2=wgmma:pingpong64x128:after_trigger:evict_last; D1=decode:twocta_ksplit1:after_trigger:plain
if grep -q H200 $OUT/r/gpu.csv; then  # the H200's plan keeps wgmma past 64 rows: the decode tile forced beside it
  BAND=("qwen3-30b-a3b 16,32,64 gemm1_tactic=$D1+gemm2_tactic=$D1" "deepseek-v3 16,32,64 gemm1_tactic=$D1+gemm2_tactic=$D1"
        "deepseek-v2-lite 16,32,42 gemm1_tactic=$D1+gemm2_tactic=$D1")
else  # the H100's plan takes the decode tile there: the tactics of the H200's plan forced beside it
  BAND=("deepseek-v3 24,32,48,64 gemm1_tactic=$OLD1+gemm2_tactic=$OLD2"
        "deepseek-v2-lite 36,40,42 fc1_activation=separate+gemm1_tactic=$OLD1+gemm2_tactic=$OLD2")
fi
for pt in "${BAND[@]}"; do
  set -- $pt; t0=$SECONDS
  timeout ${BAND_S:-70} python3 -m moe_build bench --quant fp8_block --shapes $1 --tokens $2 --variants "ours,ours:$3" \
    --iters 10 --input-sets 2 --json $OUT/r/band_$1.json > $OUT/r/band_$1.log 2>&1
  echo "band $1 rc=$? $((SECONDS-t0))s"
done
t0=$SECONDS
timeout ${TESTS_S:-120} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fp8_gemm.py tests/gpu/test_fp8_gemm_gated.py \
  -k "pingpong64x256" --gpu-cases=pairs > $OUT/r/tests.log 2>&1
echo "tests rc=$? $((SECONDS-t0))s: $(tail -1 $OUT/r/tests.log)"; grep -h "^FAILED\|^ERROR" $OUT/r/tests.log | head -8
tar cJf $OUT/r.tar.xz -C $OUT r
python3 - $OUT/r <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for p in json.loads(f.read_text())["points"]:
        vs = p["variants"]
        base = vs.get("ours", {}).get("graph_us")
        cells = []
        for v, e in vs.items():
            u = e.get("graph_us")
            name = v.replace("ours:", "").replace("gemm1_tactic=", "g1=").replace("gemm2_tactic=", "g2=")
            cells.append(f"{name[:28]} {u:.1f}" if u else f"{name[:28]} -")
        print(f"{p['shape'][:12]:12s} {p['tokens']:5d} | " + " | ".join(cells))
PY
