#!/usr/bin/env bash
# Session s19's device calls: unpack the carried sm_90a libraries and the experiment's Python tree.
set -u
cd "$(dirname "$0")/../.."
for f in .device_carry/s19/*.tar.xz; do
  n=$(basename $f .tar.xz); mkdir -p /tmp/$n
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $f /tmp/$n
done
[ -d /tmp/exp_py/moe_build ] && [ ! -e /tmp/exp_py/moe_build/plugins ] && ln -s "$PWD/plugins" /tmp/exp_py/moe_build/plugins
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
export PYTHONPATH="/tmp/exp_py:$PWD/bench"
mkdir -p "$OUT"
