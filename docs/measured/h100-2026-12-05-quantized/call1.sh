# s16 call 1: the whole (pairwise) single-GPU suite in shards, main's library (s14 head = main's C++), FP8 tool checkpoints.
set -u
mkdir -p /tmp/head && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s14/head.tar.xz /tmp/head
export MOE_BUILD_KERNELS_LIB=/tmp/head/libmoe_build_kernels.so
export MOE_BUILD_FP8_TOOL_CHECKPOINTS=$PWD/.device_carry/fp8_tool_checkpoints
PHASES=tests_split TESTS_S=${TESTS_S:-500} bash scripts/device_run.sh
mkdir -p $OUT/r && tar -xzf $OUT/results.tgz -C $OUT/r
cat $OUT/r/phases.txt
grep -hE "^(FAILED|ERROR)" $OUT/r/gpu_tests_split_*.log | cut -c1-250 | head -30
grep -h "GPU cases" $OUT/r/gpu_tests_split_*.log | head -8
