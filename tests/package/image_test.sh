#!/usr/bin/env bash
# The image (containers/Containerfile) built by scripts/build-image with podman from the wheel,
# over a clean Debian 12 base (tests/package/podman.sh), without torch (--build-arg TORCH=: the
# demo then runs its torch-free loop), then run: its default command is the demo, 2 workers
# under dlrun, and its job report; then a user's command line in it.
# With ARCH arm64: the image for Grace nodes (scripts/build-image --arch arm64) over the arm64
# root, built and run through qemu-user.
#   image_test.sh SOURCE_DIR [ARCH]
set -euo pipefail
src=$1 arch=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
if [[ $(id -u) -ne 0 ]]; then echo "SKIP: podman's storage here needs root"; exit 77; fi
command -v podman >/dev/null || { echo "FAIL: podman missing: scripts/install-deps --system"; exit 1; }
source "$here/podman.sh"
base=$(base_image "$arch")
podman_probe "$base"
arch_flags=()
[[ -n "$arch" ]] && arch_flags=(--arch "$arch")
tag=localhost/dlrun-test:$$
trap 'podman rmi -f "$tag" >/dev/null 2>&1 || true' EXIT
t0=$SECONDS
name=$("$src/scripts/build-image" -t "$tag" "${arch_flags[@]}" --build-arg "BASE=$base" --build-arg TORCH= \
  "${PODMAN_FLAGS[@]}" 2>"${TMPDIR:-/tmp}/build-image.$$.log") ||
  { cat "${TMPDIR:-/tmp}/build-image.$$.log"; echo "FAIL: scripts/build-image"; exit 1; }
rm -f "${TMPDIR:-/tmp}/build-image.$$.log"
[[ "$name" == "$tag" ]] || { echo "FAIL: build-image printed '$name', not $tag"; exit 1; }
echo "image built in $((SECONDS - t0)) s"
out=$(timeout 120 podman run --rm "${PODMAN_FLAGS[@]}" "$tag" 2>&1) || { echo "$out"; echo "FAIL: the demo"; exit 1; }
echo "$out"
for r in 0 1; do
  grep -q "\[rank $r\]: rank $r: done (20 steps)" <<<"$out" || { echo "FAIL: rank $r of the demo"; exit 1; }
done
grep -q "all 2 worker(s) finished successfully" <<<"$out" || { echo "FAIL: dlrun's end line"; exit 1; }
grep -q "job report: succeeded" <<<"$out" || { echo "FAIL: no job report"; exit 1; }
grep -q "rank 1 (.*): 20 steps" <<<"$out" || { echo "FAIL: the report has no steps of rank 1"; exit 1; }
# A user's command: dlrun on PATH, its version, the helper package.
v=$(podman run --rm "${PODMAN_FLAGS[@]}" "$tag" sh -c 'dlrun --version && python -c "import dlrun; print(dlrun.__version__)"')
grep -q "^dlrun [0-9.]* (torchrun-compatible launcher)$" <<<"$v" || { echo "$v"; echo "FAIL: dlrun --version in the image"; exit 1; }
if [[ -n "$arch" ]]; then
  m=$(podman run --rm "${PODMAN_FLAGS[@]}" "$tag" sh -c 'uname -m; python3 -c "import platform; print(platform.machine())"')
  [[ "$(sort -u <<<"$m")" == aarch64 ]] || { echo "$m"; echo "FAIL: the $arch image does not run as aarch64"; exit 1; }
fi
echo "image ok${arch:+ ($arch)}: built with podman from the wheel, the demo's 2 workers ran and the report came"
