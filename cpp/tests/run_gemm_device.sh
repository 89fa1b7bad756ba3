#!/usr/bin/env bash
# One device call: use the carried .device_carry/libmb_gemm.so (rebuilt here with all cores if it
# does not load on this image), run the GEMM tests, then the benchmark; logs under $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MB_KERNELS_LIB=$PWD/.device_carry/libmb_gemm.so MB_CUTLASS_INCLUDE=$PWD/.device_carry/cutlass_include
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if ! python3 -c "import ctypes,os; ctypes.CDLL(os.environ['MB_KERNELS_LIB'])" 2>"$OUT/load.err"; then
  echo "carried library does not load ($(head -c 200 "$OUT/load.err")); building here"
  export MB_KERNELS_LIB=$PWD/build/libmb_gemm.so
  python3 -c "import importlib.util,sys; s=importlib.util.spec_from_file_location('g','cpp/tests/gemm_lib.py'); m=importlib.util.module_from_spec(s); s.loader.exec_module(m); m.build_library(m.REPO/'build'/'libmb_gemm.so')" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemm_kernels.py -rf --tb=short ${PYTEST_ARGS:-} > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | cut -c1-300 | tail -25
timeout ${BENCH_TIMEOUT:-240} python3 bench/gemm_bench.py ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -22 "$OUT/bench.log"
