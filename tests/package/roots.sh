#!/usr/bin/env bash
# Clean Debian roots for the install tests (tests/package/wheel_test.sh, the image):
#   roots.sh SUITE [ARCH] prints the path of a minimal SUITE root (bookworm, bullseye, ...) with
#                         python3 and python3-venv only: no compiler, no -dev package; ARCH
#                         arm64 makes an arm64 one, whose programs run through qemu-user.
# Made once with debootstrap from Debian's archive (~1.5 min each) and kept outside the checkout,
# as the torch environment is ($DLRUN_VENV_HOME/roots, default ~/.cache/dlrun/roots); tests
# never change it (they work on an overlay of it: in_root below).
#   source roots.sh; in_root ROOT UPPER CMD...   runs CMD chrooted in an overlay of ROOT whose
#                         changes land in UPPER, with /proc, /dev/shm and /work (the caller's
#                         $WORK directory) mounted, in a mount and PID namespace of its own;
#                         with IN_ROOT_USER=UID, as that user (no entry in /etc/passwd, as on
#                         many clusters' nodes), HOME a read-only /home/ro, TMPDIR and XDG_*
#                         under /work (which the caller makes writable for UID); with
#                         IN_ROOT_NO_PROC=1, /proc not mounted (a chroot entered by hand).
set -euo pipefail

roots_home=${DLRUN_VENV_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/dlrun}/roots
ROOT_PACKAGES=python3,python3-venv

make_root() {  # SUITE [ARCH]: ARCH another CPU's (arm64) runs through qemu-user (enable_qemu)
  local suite=$1 arch=${2:-} name=$1 opts=()
  if [[ -n "$arch" && "$arch" != "$(dpkg --print-architecture)" ]]; then
    name=$suite-$arch opts=(--arch="$arch")
    enable_qemu "$arch" || return 2
  fi
  local dir="$roots_home/$name"
  mkdir -p "$roots_home"
  exec 8>"$roots_home/.$name.lock"
  flock 8
  if [[ "$(cat "$dir/.dlrun-root" 2>/dev/null)" != "$ROOT_PACKAGES" ]]; then
    command -v debootstrap >/dev/null || { echo "roots.sh: debootstrap missing: scripts/install-deps --system" >&2; return 2; }
    rm -rf "$dir" "$dir.tmp"
    local t0=$SECONDS
    if ! debootstrap "${opts[@]}" --variant=minbase --include="$ROOT_PACKAGES" "$suite" "$dir.tmp" \
        >"$roots_home/$name.log" 2>&1; then
      echo "roots.sh: debootstrap $name failed (log: $roots_home/$name.log)" >&2
      rm -rf "$dir.tmp"
      return 1
    fi
    rm -rf "$dir.tmp/var/cache/apt/archives/"*.deb
    echo "$ROOT_PACKAGES" >"$dir.tmp/.dlrun-root"
    mv "$dir.tmp" "$dir"
    echo "roots.sh: $name root made in $((SECONDS - t0)) s" >&2
  fi
  exec 8>&-
  echo "$dir"
}

# enable_qemu ARCH: the kernel runs ARCH's programs through Debian's qemu-user-static (binfmt_misc
# mounted if it is not, the handler enabled; its F flag lets it work inside a chroot).
enable_qemu() {
  local q
  case "$1" in
    arm64) q=qemu-aarch64 ;;
    *) echo "roots.sh: no qemu-user handler known for '$1'" >&2; return 1 ;;
  esac
  [[ -e /proc/sys/fs/binfmt_misc/register ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc ||
    { echo "roots.sh: cannot mount binfmt_misc" >&2; return 1; }
  if [[ ! -e /proc/sys/fs/binfmt_misc/$q ]]; then
    command -v update-binfmts >/dev/null || { echo "roots.sh: qemu-user-static missing: scripts/install-deps --system" >&2; return 1; }
    update-binfmts --enable "$q" >/dev/null 2>&1 || true
  fi
  grep -q '^enabled' "/proc/sys/fs/binfmt_misc/$q" 2>/dev/null ||
    { echo "roots.sh: the binfmt_misc handler $q is not enabled (qemu-user-static installed?)" >&2; return 1; }
}

# in_root ROOT UPPER CMD...: see above. WORK (a directory) is bind-mounted at /work.
in_root() {
  local root=$1 upper=$2
  shift 2
  mkdir -p "$upper/upper" "$upper/work" "$upper/merged"
  unshare --mount --pid --fork --propagation private bash -c '
    set -e
    root=$1 upper=$2 work=$3 user=$4 no_proc=$5
    shift 5
    mount -t overlay overlay -o "lowerdir=$root,upperdir=$upper/upper,workdir=$upper/work" "$upper/merged"
    m=$upper/merged
    [[ -n "$no_proc" ]] || mount -t proc proc "$m/proc"
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
  ' in_root "$root" "$upper" "${WORK:-}" "${IN_ROOT_USER:-}" "${IN_ROOT_NO_PROC:-}" "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  make_root "${1:?usage: roots.sh SUITE [ARCH]}" "${2:-}"
fi
