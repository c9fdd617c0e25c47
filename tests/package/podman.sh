#!/usr/bin/env bash
# Sourced by the container tests: the base image made from a clean Debian 12 root (roots.sh; no
# registry is reachable here), and the flags podman needs on this machine.
#   base_image [ARCH]   prints localhost/dlrun-test-base:bookworm[-ARCH], importing the root once
#   PODMAN_FLAGS        for podman run and podman build (set by podman_probe)
# This machine's podman has no netavark (so --network host, as multi-node jobs use anyway),
# may not raise rlimits above the caller's (so --ulimit at the current limits), and crun cannot
# run under its hybrid cgroups (so runc when crun fails). On a usual machine the probe finds
# that plain `podman run` works and the flags are only --network host.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/roots.sh"

base_image() {  # [ARCH]: arm64 for the arm64 root (through qemu-user)
  local arch=${1:-} img=localhost/dlrun-test-base:bookworm root import=()
  root=$(make_root bookworm "$arch")
  if [[ -n "$arch" ]]; then
    img=$img-$arch import=(--arch "$arch")
  fi
  # Re-import when the root was made again (its stamp is newer than the image).
  if ! podman image exists "$img" ||
     [[ "$(podman image inspect -f '{{.Labels.root_stamp}}' "$img" 2>/dev/null)" != "$(stat -c %Y "$root/.dlrun-root")" ]]; then
    tar -C "$root" -c . | podman import "${import[@]}" --change "LABEL root_stamp=$(stat -c %Y "$root/.dlrun-root")" - "$img" >/dev/null
  fi
  echo "$img"
}

podman_probe() {
  local img=$1
  PODMAN_FLAGS=(--network host)
  if podman run --rm "${PODMAN_FLAGS[@]}" "$img" true 2>/dev/null; then return 0; fi
  PODMAN_FLAGS+=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=8192:8192)
  if podman run --rm "${PODMAN_FLAGS[@]}" "$img" true 2>/dev/null; then return 0; fi
  PODMAN_FLAGS+=(--runtime runc)
  podman run --rm "${PODMAN_FLAGS[@]}" "$img" true || { echo "podman cannot run a container here" >&2; return 1; }
}
