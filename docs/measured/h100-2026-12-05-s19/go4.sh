#!/usr/bin/env bash
# Session s19's call 4: the carried libraries, and a copy of the repository per experiment with its tree laid over it
# (moe_build/, tests), each run from its own copy so that `python -m` imports that copy's moe_build.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
for f in .device_carry/s19/lib_*.tar.xz; do
  n=$(basename $f .tar.xz); mkdir -p /tmp/$n
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" $f /tmp/$n
done
for x in pf i8; do
  rm -rf /tmp/repo_$x; mkdir -p /tmp/repo_$x
  tar cf - --exclude=.device_carry --exclude=.git . | tar xf - -C /tmp/repo_$x
  rm -rf /tmp/repo_$x/moe_build
  python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" .device_carry/s19/tree_$x.tar.xz /tmp/repo_$x
  ln -s ../plugins /tmp/repo_$x/moe_build/plugins
done
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
mkdir -p "$OUT"
