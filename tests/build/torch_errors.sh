#!/usr/bin/env bash
# The set-up's bad input: each case is one line naming the fix, and a non-zero exit.
#   torch_errors.sh SOURCE_DIR
# A torch too old, a CPU-only LibTorch asked for CUDA, nvcc's CUDA major disagreeing with torch's,
# a Python without torch (scripts/install-torch and CMake), and no network for the pip install.
# Fake LibTorch trees (a TorchConfig.cmake and its version file) stand in for the real ones.
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() {  # expect NAME PATTERN CMD...: CMD fails and its error says PATTERN in one line
  local name=$1 pattern=$2; shift 2
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  local line
  line=$(grep -E "$pattern" <<<"$out" | head -1 || true)
  if ((rc == 0)) || [[ -z "$line" ]]; then
    echo "FAIL $name: exit $rc, no line matching '$pattern' in:"; echo "$out" | tail -15
    fails=$((fails + 1))
  else
    echo "ok   $name: $line"
  fi
}
fake_torch() {  # fake_torch DIR VERSION [CUDA]: a LibTorch tree with TorchConfig.cmake
  mkdir -p "$1/share/cmake/Torch" "$1/lib"
  echo 'message(FATAL_ERROR "the fake TorchConfig.cmake must not be reached")' \
    >"$1/share/cmake/Torch/TorchConfig.cmake"
  echo "set(PACKAGE_VERSION \"$2\")" >"$1/share/cmake/Torch/TorchConfigVersion.cmake"
  if [[ -n "${3:-}" ]]; then
    : >"$1/lib/libtorch_cuda.so"
    echo "cuda = '$3'" >"$1/version.py"
  fi
}
configure() { cmake -S "$src" -B "$tmp/b-$1" -G Ninja -DDLRUN_BUILD_TESTS=OFF "${@:2}"; }

fake_torch "$tmp/old" 1.13.1
expect "torch too old" "LibTorch 1.13.1 .* is too old: dlrun needs torch >= 2.4" \
  configure old -DTorch_DIR="$tmp/old/share/cmake/Torch"
fake_torch "$tmp/cpu" 2.5.1
expect "CPU-only LibTorch asked for CUDA" "DLRUN_CUDA=ON but LibTorch 2.5.1 .* is a CPU-only build" \
  configure cpu -DTorch_DIR="$tmp/cpu/share/cmake/Torch" -DDLRUN_CUDA=ON
if command -v nvcc >/dev/null; then
  major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  fake_torch "$tmp/cuda" 2.15.0 "$((major - 1)).8"
  expect "nvcc's CUDA disagreeing with torch's" "nvcc's CUDA .* does not match LibTorch's CUDA $((major - 1)).8" \
    configure cuda -DTorch_DIR="$tmp/cuda/share/cmake/Torch"
fi
mkdir -p "$tmp/empty"
expect "DLRUN_PYTHON without torch (CMake)" "cannot import torch .*: run scripts/install-deps" \
  env -u CMAKE_PREFIX_PATH -u Torch_DIR DLRUN_PYTHON=/usr/bin/python3 cmake -S "$src" -B "$tmp/b-py" -G Ninja -DDLRUN_BUILD_TESTS=OFF
# scripts/install-torch in a copy of the scripts (it links .venv beside them).
mkdir -p "$tmp/co/scripts"
cp "$src/scripts/install-torch" "$tmp/co/scripts/"
expect "DLRUN_PYTHON without torch (install-torch)" "DLRUN_PYTHON='/usr/bin/python3' cannot import torch: install torch>=2.4 in it" \
  env DLRUN_PYTHON=/usr/bin/python3 "$tmp/co/scripts/install-torch"
expect "no network for the pip install" "pip could not install torch==.* check the network, or set DLRUN_PYTHON" \
  env -u DLRUN_PYTHON DLRUN_VENV_HOME="$tmp/venvs" PIP_INDEX_URL=http://127.0.0.1:9/simple \
  PIP_FIND_LINKS= PIP_NO_INDEX= PIP_RETRIES=0 PIP_TIMEOUT=2 "$tmp/co/scripts/install-torch"
[[ ! -e "$tmp/co/.venv" ]] || { echo "FAIL: a failed install left .venv behind"; fails=$((fails + 1)); }
((fails == 0)) && echo "torch set-up errors: all one line, all non-zero" || exit 1
