#!/usr/bin/env bash
# Installs dlrun into a temporary prefix, builds examples/custom_trainer against it with
# find_package(dlrun) as a user's project would, and runs it under the installed dlrun.
#   build_example.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# The LibTorch dlrun was built with (a user names theirs the same way).
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
cmake -S "$src/examples/custom_trainer" -B "$tmp/ct" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DTorch_DIR="$torch_dir" -DTORCH_CUDA_ARCH_LIST="8.0;9.0" \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
ninja -C "$tmp/ct" >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; exit 1; }
export OMP_NUM_THREADS=1
out=$("$tmp/prefix/bin/dlrun" --nproc-per-node 2 "$tmp/ct/custom_trainer" "$tmp/ckpt" 2>&1)
echo "$out" | grep -q "rank 0: 80 steps" || { echo "$out"; echo "FAIL: no 80-step run"; exit 1; }
ls "$tmp/ckpt"/ckpt-000000000080.dlrun >/dev/null
# A second run resumes from the step-80 checkpoint instead of training again.
out=$("$tmp/prefix/bin/dlrun" --nproc-per-node 2 "$tmp/ct/custom_trainer" "$tmp/ckpt" 2>&1)
echo "$out" | grep -q "rank 1: 80 steps" || { echo "$out"; echo "FAIL: no resume"; exit 1; }
echo "package ok: find_package(dlrun) build, 2-rank run, resume from checkpoint"
