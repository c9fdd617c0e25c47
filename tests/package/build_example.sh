#!/usr/bin/env bash
# Builds examples/custom_trainer as a user's project would, with find_package(dlrun) and no flag
# beyond CMAKE_PREFIX_PATH (LibTorch: the project's PyPI torch, a CUDA build), and runs it under
# that dlrun: 40 steps, then a kill at step 13 and a resume that ends bit for bit the same.
#   build_example.sh SOURCE_DIR BUILD_DIR          dlrun from `cmake --install BUILD_DIR`
#   build_example.sh SOURCE_DIR --wheel WHEEL_DIR  dlrun from `pip install` of the wheel into a
#                                                  fresh virtual environment (its CMake package
#                                                  builds dlrun::worker from the sources it ships)
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The project's torch: what `python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'`
# says, as a user finds theirs.
# Resolved: .venv is a link to the machine's shared torch environment, and its real path is the
# same in every clone (so the test's compiles, whose include paths it is in, hit ccache across
# clones: through the link each clone preprocessed LibTorch's headers under a path of its own).
torch_prefix=$(realpath "$("$src/.venv/bin/python3" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')")
if [[ "$build" == "--wheel" ]]; then
  whl=$(ls "$3"/dlrun-*_"$(uname -m)".whl | head -1)
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/pip" install --no-index --disable-pip-version-check -q "$whl"
  prefix=$("$tmp/venv/bin/python" -m dlrun --cmake-prefix-path)
  [[ "$prefix" == "$("$tmp/venv/bin/dlrun" --cmake-prefix-path)" ]] ||
    { echo "FAIL: python -m dlrun and dlrun disagree on the CMake prefix"; exit 1; }
  dlrun=$tmp/venv/bin/dlrun
else
  cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
  prefix=$tmp/prefix
  dlrun=$tmp/prefix/bin/dlrun
fi
# Nothing but CMAKE_PREFIX_PATH: no Torch_DIR, no TORCH_CUDA_ARCH_LIST (the package sees to the
# CUDA LibTorch's architecture probe).
# The test's own speed-up, not the user's: through ccache where it is installed.
source "$(dirname "$0")/ccache.sh"
ccache_launcher "$tmp"
# The project copied out, as a user's own tree is (and under ccache's base directory, so its
# compile is a hit from any clone).
cp -r "$src/examples/custom_trainer" "$tmp/project"
cmake -S "$tmp/project" -B "$tmp/ct" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" "${launcher[@]}" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; echo "FAIL: the configure with CMAKE_PREFIX_PATH alone"; exit 1; }
grep "dlrun" "$tmp/configure.log" || true
ninja -C "$tmp/ct" -j 2 >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; exit 1; }
if [[ "$build" != "--wheel" ]] &&
   grep -nE '(/[^";]*)?lib(c10|torch[a-z_]*)\.so' "$tmp/prefix"/lib*/cmake/dlrun/dlrunTargets*.cmake; then
  # The exported targets name no library of the build machine by its path (LibTorch comes from
  # the consumer's own find_package(Torch) through dlrun::torch).
  echo "FAIL: the installed targets hard-code LibTorch's library paths"; exit 1
fi
export OMP_NUM_THREADS=1
trainer=$tmp/ct/custom_trainer
# An uninterrupted run: 40 steps, every rank ends with the same parameters.
out=$("$dlrun" --nproc-per-node 2 "$trainer" "$tmp/ckpt-a" 2>&1) || { echo "$out"; exit 1; }
clean=$(echo "$out" | sed -n 's/.*rank 0: 40 steps, .*parameters \([0-9a-f]*\), the same on every rank$/\1/p')
[ -n "$clean" ] || { echo "$out"; echo "FAIL: no 40-step run with agreeing ranks"; exit 1; }
ls "$tmp/ckpt-a"/ckpt-000000000040.dlrun >/dev/null
# ends_as_clean WHAT: every rank of the run in $out ended with the uninterrupted run's parameters.
ends_as_clean() {
  for r in 0 1; do
    echo "$out" | grep -q "rank $r: 40 steps, .*parameters $clean, the same on every rank" ||
      { echo "$out"; echo "FAIL: rank $r does not end with the uninterrupted run's parameters $clean $1"; exit 1; }
  done
}
# Killed: rank 1 SIGKILLs itself at the end of step 13. The trainer's loop is
# dlrun::worker::Recoverable's: dlrun replaces the rank in process (one step), and the run ends
# bit for bit where the uninterrupted run did, on every rank.
out=$("$dlrun" --nproc-per-node 2 "$trainer" "$tmp/ckpt-b" --die-at-step 13 2>&1) ||
  { echo "$out"; exit 1; }
echo "$out" | grep -q "in-process recovery done: every rank holds the state of step 1[23] " ||
  { echo "$out"; echo "FAIL: no in-process recovery"; exit 1; }
ends_as_clean "(in process)"
# The same with --recovery restart: dlrun restarts the group, which resumes from the step-10
# checkpoint in the middle of epoch 1 (8 steps of 16 samples per epoch and rank) with the EMA
# weights, and ends bit for bit where the uninterrupted run did, on every rank.
out=$("$dlrun" --nproc-per-node 2 --recovery restart --max-restarts 1 "$trainer" "$tmp/ckpt-c" --die-at-step 13 2>&1) ||
  { echo "$out"; exit 1; }
echo "$out" | grep -q "resumed at step 10, epoch 1, sample 32 of this rank's share" ||
  { echo "$out"; echo "FAIL: no mid-epoch resume"; exit 1; }
ends_as_clean "(--recovery restart)"
echo "package ok: find_package(dlrun) build, 2-rank run, kill at step 13 recovered in process, and with --recovery restart a mid-epoch resume from step 10, parameters $clean on every rank as without the kill"
