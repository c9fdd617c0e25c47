#!/usr/bin/env bash
# Clean Debian roots for the install tests (tests/package/wheel_test.sh, the image):
#   roots.sh SUITE        prints the path of a minimal SUITE root (bookworm, bullseye, ...) with
#                         python3 and python3-venv only: no compiler, no -dev package.
# Made once with debootstrap from Debian's archive (~1.5 min each) and kept outside the checkout,
# as the torch environment is ($DLRUN_VENV_HOME/roots, default ~/.cache/dlrun/roots); tests
# never change it (they work on an overlay of it: in_root below).
#   source roots.sh; in_root ROOT UPPER CMD...   runs CMD chrooted in an overlay of ROOT whose
#                         changes land in UPPER, with /proc, /dev/shm and /work (the caller's
#                         $WORK directory) mounted, in a mount and PID namespace of its own;
#                         with IN_ROOT_USER=UID, as that user (no entry in /etc/passwd, as on
#                         many clusters' nodes), HOME a read-only /home/ro, TMPDIR and XDG_*
#                         under /work (which the caller makes writable for UID).
set -euo pipefail

roots_home=${DLRUN_VENV_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/dlrun}/roots
ROOT_PACKAGES=python3,python3-venv

make_root() {
  local suite=$1 dir="$roots_home/$1"
  mkdir -p "$roots_home"
  exec 8>"$roots_home/.$suite.lock"
  flock 8
  if [[ "$(cat "$dir/.dlrun-root" 2>/dev/null)" != "$ROOT_PACKAGES" ]]; then
    command -v debootstrap >/dev/null || { echo "roots.sh: debootstrap missing: scripts/install-deps --system" >&2; return 2; }
    rm -rf "$dir" "$dir.tmp"
    local t0=$SECONDS
    if ! debootstrap --variant=minbase --include="$ROOT_PACKAGES" "$suite" "$dir.tmp" \
        >"$roots_home/$suite.log" 2>&1; then
      echo "roots.sh: debootstrap $suite failed (log: $roots_home/$suite.log)" >&2
      rm -rf "$dir.tmp"
      return 1
    fi
    rm -rf "$dir.tmp/var/cache/apt/archives/"*.deb
    echo "$ROOT_PACKAGES" >"$dir.tmp/.dlrun-root"
    mv "$dir.tmp" "$dir"
    echo "roots.sh: $suite root made in $((SECONDS - t0)) s" >&2
  fi
  exec 8>&-
  echo "$dir"
}

# in_root ROOT UPPER CMD...: see above. WORK (a directory) is bind-mounted at /work.
in_root() {
  local root=$1 upper=$2
  shift 2
  mkdir -p "$upper/upper" "$upper/work" "$upper/merged"
  unshare --mount --pid --fork --propagation private bash -c '
    set -e
    root=$1 upper=$2 work=$3 user=$4
    shift 4
    mount -t overlay overlay -o "lowerdir=$root,upperdir=$upper/upper,workdir=$upper/work" "$upper/merged"
    m=$upper/merged
    mount -t proc proc "$m/proc"
    mount -t tmpfs -o size=256m tmpfs "$m/dev/shm" 2>/dev/null || { mkdir -p "$m/dev/shm"; mount -t tmpfs -o size=256m tmpfs "$m/dev/shm"; }
    for d in null zero random urandom; do
      [[ -c "$m/dev/$d" ]] || { touch "$m/dev/$d"; mount --bind "/dev/$d" "$m/dev/$d"; }
    done
    mkdir -p "$m/work"
    [[ -n "$work" ]] && mount --bind "$work" "$m/work"
    if [[ -n "$user" ]]; then  # a cluster user: not root, HOME read-only, TMPDIR and XDG_* in /work
      mkdir -p "$m/home/ro" && chmod 555 "$m/home/ro"
      exec chroot --userspec="$user:$user" --groups="$user" "$m" /usr/bin/env -i HOME=/home/ro \
        PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TMPDIR=/work/tmp \
        XDG_CACHE_HOME=/work/xdg/cache XDG_CONFIG_HOME=/work/xdg/config \
        XDG_DATA_HOME=/work/xdg/data XDG_STATE_HOME=/work/xdg/state "$@"
    fi
    exec chroot "$m" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 "$@"
  ' in_root "$root" "$upper" "${WORK:-}" "${IN_ROOT_USER:-}" "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  make_root "${1:?usage: roots.sh SUITE}"
fi
