#!/usr/bin/env bash
# train_unet from the wheel, where only Python, torch, CMake and a compiler are (issue 59):
#   build_unet.sh SOURCE_DIR WHEEL_DIR
# scripts/build-unet-from-wheel (as scripts/gpu-check uses it) puts the wheel in a fresh virtual
# environment; the CMakeLists.txt it ships in share/dlrun/examples/unet builds train_unet against
# the wheel's dlrun::worker and the project's torch with nothing but CMAKE_PREFIX_PATH, yaml-cpp
# and HDF5 turned off (as where they are missing). This machine has every -dev package the dlrun
# tree needs, so the test checks what the build used: no header beyond LibTorch's, the wheel's,
# the CUDA toolkit's and the compiler's and C library's own (ninja's dependency log, each
# /usr/include file's Debian package), no library linked beyond LibTorch's and the C/C++
# runtime's. Then train_unet trains a few steps on two CPU ranks under the wheel's dlrun, and
# --config and --data say in one line that they are not built in.
set -euo pipefail
src=$1 wheels=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
torch_prefix=$(realpath "$("$src/.venv/bin/python3" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')")
torch_root=$(realpath "$torch_prefix/../..")  # site-packages/torch
whl=$(ls "$wheels"/dlrun-*_"$(uname -m)".whl | head -1)
# The test's own speed-up, not the user's: through ccache where it is installed.
source "$(dirname "$0")/ccache.sh"
ccache_launcher "$tmp"
# The script scripts/gpu-check uses on a GPU machine, with the project's torch.
PYTHON=$src/.venv/bin/python3 "$src/scripts/build-unet-from-wheel" "$whl" "$tmp" \
  -DDLRUN_UNET_YAML=OFF -DDLRUN_UNET_HDF5=OFF "${launcher[@]}" >"$tmp/out.log" 2>&1 ||
  { cat "$tmp/out.log"; fail "scripts/build-unet-from-wheel"; }
grep -q "train_unet: YAML configurations: NO; HDF5 data files: NO" "$tmp/out.log" ||
  { cat "$tmp/out.log"; fail "the configure did not turn yaml-cpp and HDF5 off"; }

# Every header the compiles read: where each one comes from.
ninja -C "$tmp/build" -t deps | awk '/^    /{print $1}' | sort -u >"$tmp/headers"
[[ $(wc -l <"$tmp/headers") -gt 100 ]] || fail "ninja's dependency log names only $(wc -l <"$tmp/headers") headers"
venv_real=$(realpath "$tmp/venv")
: >"$tmp/system"
while read -r h; do
  [[ "$h" == /* ]] || h=$tmp/build/$h  # ninja names headers relative to the build directory
  r=$(realpath -m "$h")
  case "$r" in
    "$torch_root"/* | "$(dirname "$torch_root")"/nvidia/* | "$venv_real"/* | "$tmp"/* | /usr/local/cuda*) ;;
    /usr/include/* | /usr/lib/gcc/*) echo "$r" >>"$tmp/system" ;;
    *) fail "train_unet's build read $r: neither LibTorch's, the wheel's nor the system compiler's" ;;
  esac
done <"$tmp/headers"
grep -q "/share/dlrun/worker/third_party/CLI/" "$tmp/headers" || fail "CLI11 did not come from the wheel"
grep -q "/share/dlrun/worker/third_party/nlohmann/" "$tmp/headers" || fail "nlohmann/json did not come from the wheel"
if [[ -s "$tmp/system" ]]; then
  # /usr/include holds the C library's headers and every -dev package's: only the first may be
  # read (and GCC's own under /usr/lib/gcc, the C++ library's under /usr/include/c++).
  xargs -a "$tmp/system" dpkg -S 2>/dev/null | cut -d: -f1 | tr ',' '\n' | sed 's/^ *//' | sort -u >"$tmp/pkgs"
  bad=$(grep -vE '^(libc6-dev|linux-libc-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libcrypt-dev|gcc-[0-9]+|g\+\+-[0-9]+|libgomp1|libc6)$' "$tmp/pkgs" || true)
  [[ -z "$bad" ]] || fail "train_unet's build read headers of $(echo $bad): expected the compiler's and the C library's only"
fi
needed=$(readelf -d "$tmp/build/bin/train_unet" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
bad=$(echo "$needed" | grep -vE '^(libtorch[a-z_]*|libc10[a-z_]*|libcuda[a-z]*|libcudart|libnccl|libnvToolsExt|libgomp[-a-z0-9]*|libstdc\+\+|libm|libc|libgcc_s|ld-linux[-a-z0-9_]*)\.so' || true)
[[ -z "$bad" ]] || fail "train_unet links $(echo $bad): expected LibTorch's and the C/C++ runtime's libraries only"

export OMP_NUM_THREADS=1
cd "$tmp"
out=$("$tmp/venv/bin/dlrun" --nproc-per-node 2 "$tmp/build/bin/train_unet" --synthetic --base-channels 4 \
  --data-size 64 --max-steps 6 2>&1) || { echo "$out"; fail "train_unet under the wheel's dlrun"; }
echo "$out" | grep -qE "final loss [0-9.]+ \(first step [0-9.]+\)" || { echo "$out"; fail "train_unet did not finish its 6 steps"; }
for bad_flag in "--config short" "--data /nonexistent.h5"; do
  # shellcheck disable=SC2086
  if err=$("$tmp/build/bin/train_unet" $bad_flag --max-steps 1 2>&1); then
    fail "train_unet $bad_flag succeeded in a build without yaml-cpp and HDF5"
  fi
  echo "$err" | grep -q "built without" || { echo "$err"; fail "train_unet $bad_flag did not say what it was built without"; }
done
echo "train_unet from the wheel: built with $(wc -l <"$tmp/headers") headers (none of this machine's -dev packages), linked to $(echo $needed | wc -w) libraries, 6 steps on 2 CPU ranks"
