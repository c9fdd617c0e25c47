#!/usr/bin/env bash
# The wheel where users are: its glibc floor checked (the tag auditwheel computes, and no glibc
# symbol version above it in bin/dlrun), then pip-installed into a fresh virtual environment in
# clean Debian 11 (glibc 2.31, the glibc of SUSE 15 and Ubuntu 20.04), 12 and 13 (Python 3.13)
# roots (debootstrap; python3 and python3-venv only: no compiler, no -dev package, none of the
# build's libraries), each as a cluster user: not root, HOME read-only, TMPDIR and XDG_* in the
# job's directory. In each, dlrun runs a 2-worker job standalone and a 2-node job through its
# gRPC rendezvous (linked into dlrun in the wheel), ldd shows nothing beyond the C library, and
# nothing is written outside the job's directory.
# With ARCH aarch64: the aarch64 wheel, the same in a clean arm64 Debian 12 root whose programs
# run through qemu-user (binfmt_misc), `file` saying ARM aarch64.
#   wheel_test.sh SOURCE_DIR WHEEL_DIR [ARCH]  (WHEEL_DIR holds dlrun-*_ARCH.whl; scripts/build-wheel)
set -euo pipefail
src=$1 wheels=$2 arch=${3:-$(uname -m)}
here=$(cd "$(dirname "$0")" && pwd)
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: the clean roots need root (unshare, chroot, mount)"; exit 77
fi
source "$here/roots.sh"
case "$arch" in
  x86_64) roots=(bullseye bookworm trixie) root_arch="" loader=/lib64/ld-linux-x86-64.so.2 elf="x86-64" ;;
  aarch64) roots=(bookworm) root_arch=arm64 loader=/lib/ld-linux-aarch64.so.1 elf="ARM aarch64" ;;
  *) echo "FAIL: unknown ARCH '$arch': expected x86_64 or aarch64"; exit 1 ;;
esac
whl=$(ls "$wheels"/dlrun-*_"$arch".whl 2>/dev/null | head -1)
[[ -n "$whl" ]] || { echo "FAIL: no dlrun-*_$arch.whl in $wheels (scripts/build-wheel makes it)"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
name=$(basename "$whl")
echo "wheel: $name"
# auditwheel from scripts/build-wheel's tool environment (it made the wheel, so it is there).
cache=${DLRUN_VENV_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/dlrun}
wheel_tools=$cache/wheel-tools

# --- The glibc floor: the tag, auditwheel's reading, the symbols --------------------------
floor=$(sed -nE 's/.*-manylinux_([0-9]+)_([0-9]+)_[a-z0-9_]+\.whl$/\1.\2/p' <<<"$name")
[[ -n "$floor" ]] || { echo "FAIL: $name has no manylinux_X_Y tag"; exit 1; }
awk -F. -v f="$floor" 'BEGIN { split(f, v, "."); exit !(v[1] == 2 && v[2] <= 28) }' ||
  { echo "FAIL: the wheel's glibc floor $floor is above 2.28 (torch's)"; exit 1; }
mkdir -p "$tmp/unpacked"
python3 -m zipfile -e "$whl" "$tmp/unpacked"
bin=$(find "$tmp/unpacked" -path '*/data/bin/dlrun' | head -1)
[[ -n "$bin" ]] || { echo "FAIL: no data/bin/dlrun in $name"; exit 1; }
file "$bin" | grep -q "$elf" || { file "$bin"; echo "FAIL: bin/dlrun is not $elf"; exit 1; }
above=$(objdump -T "$bin" | grep -oE 'GLIBC_2\.[0-9]+' | sort -u -t. -k2,2n |
  awk -F. -v f="${floor#2.}" '$2 > f' | tr '\n' ' ')
[[ -z "$above" ]] || { echo "FAIL: bin/dlrun needs $above, above the tag's glibc $floor"; exit 1; }
show=$("$wheel_tools/bin/auditwheel" show "$whl" 2>&1) || { echo "$show"; echo "FAIL: auditwheel show"; exit 1; }
tag=$(sed -E 's/.*-py3-none-//; s/\.whl$//' <<<"$name")
grep -q "\"$tag\"" <<<"$(tr -d '\n' <<<"$show" | tr -s ' ')" ||
  { echo "$show"; echo "FAIL: auditwheel show does not name the wheel's tag $tag"; exit 1; }
echo "glibc floor: $floor (tag $tag, auditwheel agrees, no symbol above it; $(file -b "$bin" | cut -d, -f1,2))"

# --- Each root: install and run as a cluster user --------------------------------------
cp "$here/wheel_prog.py" "$tmp/"
# dlrun[tools]'s py-spy for this architecture, from PyPI once (the roots have no network).
house=$cache/wheelhouse/$arch
if ! ls "$house"/py_spy-*.whl >/dev/null 2>&1; then
  "$wheel_tools/bin/pip" download --no-deps --only-binary=:all: --platform "manylinux2014_$arch" \
    --disable-pip-version-check -q -d "$house" "py-spy>=0.4" ||
    { echo "FAIL: could not download py-spy for $arch from PyPI"; exit 1; }
fi
# The `pip install --user` job's lines: ~/.local from --cmake-prefix-path N times, both ranks
# ran on the system python3.  user_install_ok SUITE WHAT OUTPUT LINE_PREFIX N RANKS_DIR
user_install_ok() {
  local suite=$1 what=$2 text=$3 label=$4 n=$5 ranks=$6 prefixes
  prefixes=$(printf ' /work/uh/.local%.0s' $(seq "$n"))
  grep -q "^${label}user cmake prefix:$prefixes$" <<<"$text" ||
    { echo "FAIL: $suite: $what: --cmake-prefix-path"; exit 1; }
  grep -q "^${label}user job ranks: rank-0 rank-1 $" <<<"$text" ||
    { echo "FAIL: $suite: $what: the 2-worker job"; exit 1; }
  grep -q "python=/usr/bin/python3$" "$ranks/rank-0" ||
    { cat "$ranks/rank-0"; echo "FAIL: $suite: $what: the workers' python"; exit 1; }
}
in_each_root() {  # SUITE: the jobs in a clean root of SUITE; the checks after
  local suite=$1 root work=$tmp/$1/work port out
  root=$(make_root "$suite" "$root_arch")
  mkdir -p "$work/out1" "$work/out2" "$work/tmp"
  cp "$whl" "$tmp/wheel_prog.py" "$work/"
  mkdir -p "$work/house" && cp "$house"/py_spy-*.whl "$work/house/"
  chown -R 1000:1000 "$work"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$work/in.sh" <<SH
set -eu
echo "user: \$(id -u) home: \$HOME"
touch "\$HOME/x" 2>/dev/null && { echo "HOME is writable"; exit 1; }
echo "python: \$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') \$(ldd --version | head -1)"
python3 -m venv /work/v
/work/v/bin/pip install --no-index --find-links /work/house --no-cache-dir --disable-pip-version-check -q "/work/$name[tools]"
echo "tools: \$(/work/v/bin/py-spy --version)"
echo "compilers: \$(ls /usr/bin | grep -cE '^(gcc|g\+\+|cc|c\+\+|clang)(-[0-9]+)?\$' || true)"
echo "dev headers: \$(ls /usr/include | grep -c . || true)"
echo "--- ldd dlrun"; ldd /work/v/bin/dlrun
/work/v/bin/dlrun --version
/work/v/bin/python -c 'import dlrun, dlrun_report; print("import dlrun", dlrun.__version__)'
# One distribution owns the launcher and the helper (python/ is no second "dlrun" any more).
/work/v/bin/pip show -f --disable-pip-version-check dlrun > /work/show.txt
grep -q "bin/dlrun\$" /work/show.txt && grep -q "dlrun_report.py\$" /work/show.txt &&
  grep -q "dlrun/__init__.py\$" /work/show.txt || { cat /work/show.txt; echo "the wheel's dlrun does not own both"; exit 1; }
# dlrun_recovery imports torch (not in this root): it must be there, not importable here.
/work/v/bin/python -c 'import importlib.util as u; assert all(u.find_spec(m) for m in ("dlrun_recovery", "dlrun_step", "dlrun_group", "dlrun_loader", "dlrun_transfer", "dlrun_profile")), "a dlrun_recovery module is missing in the wheel"'
echo "cmake prefix: \$(/work/v/bin/dlrun --cmake-prefix-path) \$(/work/v/bin/python -m dlrun --cmake-prefix-path)"
# Standalone, without activating the environment: the workers get its python3.
/work/v/bin/dlrun --standalone --nproc-per-node 2 /work/wheel_prog.py /work/out1
# Two agents, one "node" each, through the gRPC rendezvous.
export DLRUN_RDZV_TOKEN=wheel-test
/work/v/bin/dlrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$port \
  --rdzv-id wheel --node-rank 0 /work/wheel_prog.py /work/out2 > /work/agent0.log 2>&1 &
a=\$!
/work/v/bin/dlrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$port \
  --rdzv-id wheel --node-rank 1 /work/wheel_prog.py /work/out2 > /work/agent1.log 2>&1
wait \$a
if [ "$suite" = bullseye ]; then  # Debian 11's python3 without a venv: pip install --user
  # Its pip (20.3.4, as python3-pip's) from a fresh venv's (not /work/v's: pip would find dlrun
  # installed there), run by the system python3: the root has no python3-pip and no network.
  # HOME a writable one for this install only.
  python3 -m venv /work/pv
  sp=\$(echo /work/pv/lib/python3*/site-packages)
  mkdir -p /work/uh /work/out3
  HOME=/work/uh PYTHONPATH=\$sp python3 -m pip install --user --no-index --no-cache-dir \
    --disable-pip-version-check -q "/work/$name"
  echo "user cmake prefix: \$(HOME=/work/uh /work/uh/.local/bin/dlrun --cmake-prefix-path) \$(HOME=/work/uh python3 -m dlrun --cmake-prefix-path)"
  HOME=/work/uh /work/uh/.local/bin/dlrun --standalone --nproc-per-node 2 /work/wheel_prog.py /work/out3
  echo "user job ranks: \$(ls /work/out3 | tr '\n' ' ')"
fi
echo "written outside /work: \$(find /tmp /var/tmp /dev/shm -user \$(id -u) 2>/dev/null | head -5 | tr '\n' ' ')"
echo "in root done"
SH
  if ! out=$(IN_ROOT_USER=1000 WORK=$work timeout 300 bash -c 'source "$1"; in_root "$2" "$3" bash /work/in.sh' _ \
      "$here/roots.sh" "$root" "$tmp/$suite/ov" 2>&1); then
    echo "$out"; cat "$work/agent0.log" "$work/agent1.log" 2>/dev/null
    echo "FAIL: the wheel does not install and run in a clean $suite root as a cluster user"; exit 1
  fi
  echo "$out" | sed "s/^/[$suite] /"
  grep -q "^user: 1000 home: /home/ro$" <<<"$out" || { echo "FAIL: $suite: not run as uid 1000 with HOME /home/ro"; exit 1; }
  grep -q "^compilers: 0$" <<<"$out" || { echo "FAIL: the $suite root has a compiler"; exit 1; }
  grep -q "^dev headers: 0$" <<<"$out" || { echo "FAIL: the $suite root has headers in /usr/include"; exit 1; }
  # ldd: only the C library's parts, the vDSO and the loader.
  bad=$(sed -n '/^--- ldd/,/^dlrun /p' <<<"$out" | grep '=>\|ld-linux' |
    grep -vE "^\s*(linux-vdso\.so\.1|lib(c|m|dl|pthread|rt)\.so\.[0-9]+ => |${loader//./\\.} )" || true)
  [[ -z "$bad" ]] || { echo "FAIL: $suite: dlrun needs more than the C library:"; echo "$bad"; exit 1; }
  grep -q "not found" <<<"$out" && { echo "FAIL: $suite: a library is not found"; exit 1; }
  grep -q "^import dlrun " <<<"$out" || { echo "FAIL: $suite: import dlrun"; exit 1; }
  grep -q "^tools: py-spy 0\.[4-9]" <<<"$out" || { echo "FAIL: $suite: dlrun[tools] brought no py-spy"; exit 1; }
  grep -q "^cmake prefix: /work/v /work/v$" <<<"$out" || { echo "FAIL: $suite: --cmake-prefix-path"; exit 1; }
  if [[ "$suite" == bullseye ]]; then
    user_install_ok "$suite" "pip install --user" "$out" "" 2 "$work/out3"
    # The same --user install in the root entered without /proc (a chroot by hand): dlrun finds
    # itself from the path it was started by, not /proc/self/exe.
    mkdir -p "$work/out4" && chown 1000:1000 "$work/out4"
    cat >"$work/noproc.sh" <<'SH'
set -eu
test -e /proc/self/exe && { echo "/proc is mounted"; exit 1; }
echo "no proc: user cmake prefix: $(HOME=/work/uh /work/uh/.local/bin/dlrun --cmake-prefix-path) $(cd /work/uh && HOME=/work/uh .local/bin/dlrun --cmake-prefix-path) $(HOME=/work/uh PATH=/work/uh/.local/bin:$PATH dlrun --cmake-prefix-path)"
HOME=/work/uh /work/uh/.local/bin/dlrun --standalone --nproc-per-node 2 /work/wheel_prog.py /work/out4
echo "no proc: user job ranks: $(ls /work/out4 | tr '\n' ' ')"
SH
    local noproc
    noproc=$(IN_ROOT_USER=1000 IN_ROOT_NO_PROC=1 WORK=$work timeout 120 bash -c \
      'source "$1"; in_root "$2" "$3" bash /work/noproc.sh' _ "$here/roots.sh" "$root" "$tmp/$suite/ov" 2>&1) ||
      { echo "$noproc"; echo "FAIL: $suite: pip install --user, without /proc"; exit 1; }
    echo "$noproc" | sed "s/^/[$suite] /"
    user_install_ok "$suite" "pip install --user, without /proc" "$noproc" "no proc: " 3 "$work/out4"
  fi
  grep -q "^written outside /work: $" <<<"$out" || { echo "FAIL: $suite: files left outside the job's directory"; exit 1; }
  # The root's own files: what the user changed there (the overlay's upper layer) must be nothing.
  local changed
  changed=$(find "$tmp/$suite/ov/upper" -user 1000 2>/dev/null | head -5)
  [[ -z "$changed" ]] || { echo "FAIL: $suite: the user wrote into the root: $changed"; exit 1; }
  for d in out1 out2; do
    for r in 0 1; do
      local f=$work/$d/rank-$r
      [[ -f "$f" ]] || { echo "FAIL: $suite $d: no rank $r"; exit 1; }
      grep -q "WORLD_SIZE=2 " "$f" || { cat "$f"; echo "FAIL: $suite $d rank $r: WORLD_SIZE"; exit 1; }
      grep -q "python=/work/v/bin/python3$" "$f" || { cat "$f"; echo "FAIL: $suite $d rank $r ran another python"; exit 1; }
    done
    [[ $(ls "$work/$d" | wc -l) == 2 ]] || { echo "FAIL: $suite $d: not exactly ranks 0 and 1"; exit 1; }
  done
  grep -q "LOCAL_WORLD_SIZE=1 GROUP_RANK=1" "$work/out2/rank-1" ||
    { cat "$work/out2/rank-1"; echo "FAIL: $suite: the 2-node job's rank 1 is not node 1's"; exit 1; }
}
for suite in "${roots[@]}"; do
  in_each_root "$suite"
done
echo "wheel ok ($arch): glibc floor $floor; installs and runs as a cluster user (uid 1000, HOME read-only) in clean ${root_arch:+$root_arch }roots of ${roots[*]} (2 workers standalone, 2 nodes over gRPC; ldd: the C library only; nothing written outside the job's directory)${root_arch:-; pip install --user in bullseye, with /proc and without}"
