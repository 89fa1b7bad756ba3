for lib in new b; do
for cfg in "128 8 1" "32 4 1" "256 8 4" "8 2 16"; do
  echo "== $lib E K T = $cfg"
  MOE_BUILD_KERNELS_LIB=/tmp/$lib/libmoe_build_kernels.so ncu --clock-control none --launch-skip 3 --launch-count 3 --section SpeedOfLight python .device_carry/s25/rk.py $cfg 2>&1 | grep -E "^  [a-z<].*kernel|Duration" | sed -E 's/\(const.*//' | paste - - | awk '{print $1, $NF}'
done; done
