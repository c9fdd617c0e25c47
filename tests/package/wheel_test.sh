#!/usr/bin/env bash
# The wheel where users are: pip-installed into a fresh virtual environment in a clean Debian 12
# root (debootstrap; python3 and python3-venv only: no compiler, no -dev package, none of the
# build's libraries), where dlrun runs a 2-worker job standalone and a 2-node job through its
# gRPC rendezvous (linked into dlrun in the wheel), and ldd shows nothing beyond the C library; then the same wheel in a
# Debian 11 root (glibc 2.31, below the wheel's floor), where pip refuses it naming the platform.
#   wheel_test.sh SOURCE_DIR WHEEL_DIR      (WHEEL_DIR holds the one dlrun-*.whl; scripts/build-wheel)
set -euo pipefail
src=$1 wheels=$2
here=$(cd "$(dirname "$0")" && pwd)
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: the clean roots need root (unshare, chroot, mount)"; exit 77
fi
source "$here/roots.sh"
whl=$(ls "$wheels"/dlrun-*.whl 2>/dev/null | head -1)
[[ -n "$whl" ]] || { echo "FAIL: no dlrun-*.whl in $wheels (scripts/build-wheel makes it)"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/work/out1" "$tmp/work/out2"
cp "$whl" "$here/wheel_prog.py" "$tmp/work/"
export WORK="$tmp/work"
name=$(basename "$whl")
echo "wheel: $name"

# --- Debian 12 ---------------------------------------------------------------------------
root12=$(make_root bookworm)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$tmp/work/in12.sh" <<SH
set -eu
python3 -m venv /opt/v
/opt/v/bin/pip install --no-index --disable-pip-version-check -q /work/$name
echo "compilers: \$(ls /usr/bin | grep -cE '^(gcc|g\+\+|cc|c\+\+|clang)(-[0-9]+)?\$' || true)"
echo "dev headers: \$(ls /usr/include | grep -c . || true)"
echo "--- ldd dlrun"; ldd /opt/v/bin/dlrun
/opt/v/bin/dlrun --version
/opt/v/bin/python -c 'import dlrun, dlrun_report; print("import dlrun", dlrun.__version__)'
# One distribution owns the launcher and the helper (python/ is no second "dlrun" any more).
/opt/v/bin/pip show -f --disable-pip-version-check dlrun > /work/show.txt
grep -q "bin/dlrun\$" /work/show.txt && grep -q "dlrun_report.py\$" /work/show.txt &&
  grep -q "dlrun/__init__.py\$" /work/show.txt || { cat /work/show.txt; echo "the wheel's dlrun does not own both"; exit 1; }
# dlrun_recovery imports torch (not in this root): it must be there, not importable here.
/opt/v/bin/python -c 'import importlib.util as u; assert u.find_spec("dlrun_recovery") and u.find_spec("dlrun_step"), "no dlrun_recovery or dlrun_step in the wheel"'
echo "cmake prefix: \$(/opt/v/bin/dlrun --cmake-prefix-path) \$(/opt/v/bin/python -m dlrun --cmake-prefix-path)"
# Standalone, without activating the environment: the workers get its python3.
/opt/v/bin/dlrun --standalone --nproc-per-node 2 /work/wheel_prog.py /work/out1
# Two agents, one "node" each, through the gRPC rendezvous (the plugin).
export DLRUN_RDZV_TOKEN=wheel-test
/opt/v/bin/dlrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$port \
  --rdzv-id wheel --node-rank 0 /work/wheel_prog.py /work/out2 > /work/agent0.log 2>&1 &
a=\$!
/opt/v/bin/dlrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$port \
  --rdzv-id wheel --node-rank 1 /work/wheel_prog.py /work/out2 > /work/agent1.log 2>&1
wait \$a
echo "in12 done"
SH
if ! out=$(timeout 300 bash -c 'source "$1"; in_root "$2" "$3" bash /work/in12.sh' _ "$here/roots.sh" \
    "$root12" "$tmp/ov12" 2>&1); then
  echo "$out"; cat "$tmp/work/agent0.log" "$tmp/work/agent1.log" 2>/dev/null
  echo "FAIL: the wheel does not install and run in a clean Debian 12 root"; exit 1
fi
echo "$out"
grep -q "^compilers: 0$" <<<"$out" || { echo "FAIL: the Debian 12 root has a compiler"; exit 1; }
grep -q "^dev headers: 0$" <<<"$out" || { echo "FAIL: the Debian 12 root has headers in /usr/include"; exit 1; }
# ldd: only the C library's parts, the vDSO and the loader (or what the wheel vendors under the
# environment, none today).
bad=$(sed -n '/^--- ldd/,/^dlrun /p' <<<"$out" | grep '=>\|ld-linux' |
  grep -vE '^\s*(linux-vdso\.so\.1|lib(c|m|dl|pthread|rt)\.so\.[0-9]+ => |/lib64/ld-linux-x86-64\.so\.2)' |
  grep -v ' => /opt/v/' || true)
[[ -z "$bad" ]] || { echo "FAIL: dlrun needs more than the C library:"; echo "$bad"; exit 1; }
grep -q "not found" <<<"$out" && { echo "FAIL: a library is not found"; exit 1; }
grep -q "^import dlrun " <<<"$out" || { echo "FAIL: import dlrun"; exit 1; }
grep -q "^cmake prefix: /opt/v /opt/v$" <<<"$out" || { echo "FAIL: --cmake-prefix-path"; exit 1; }
for d in out1 out2; do
  for r in 0 1; do
    f=$tmp/work/$d/rank-$r
    [[ -f "$f" ]] || { echo "FAIL: $d: no rank $r"; exit 1; }
    grep -q "WORLD_SIZE=2 " "$f" || { cat "$f"; echo "FAIL: $d rank $r: WORLD_SIZE"; exit 1; }
    grep -q "python=/opt/v/bin/python3$" "$f" || { cat "$f"; echo "FAIL: $d rank $r ran another python"; exit 1; }
  done
  [[ $(ls "$tmp/work/$d" | wc -l) == 2 ]] || { echo "FAIL: $d: not exactly ranks 0 and 1"; exit 1; }
done
grep -q "LOCAL_WORLD_SIZE=1 GROUP_RANK=1" "$tmp/work/out2/rank-1" ||
  { cat "$tmp/work/out2/rank-1"; echo "FAIL: the 2-node job's rank 1 is not node 1's"; exit 1; }

# --- Debian 11: glibc 2.31 ----------------------------------------------------------------
root11=$(make_root bullseye)
cat >"$tmp/work/in11.sh" <<SH
python3 -m venv /opt/v
ldd --version | head -1
/opt/v/bin/pip install --no-index --disable-pip-version-check /work/$name 2>&1
echo "pip rc=\$?"
SH
out11=$(timeout 300 bash -c 'source "$1"; in_root "$2" "$3" bash /work/in11.sh' _ "$here/roots.sh" \
  "$root11" "$tmp/ov11" 2>&1) || true
echo "$out11"
if grep -q "pip rc=0" <<<"$out11"; then
  echo "FAIL: pip installed a wheel tagged $(sed 's/.*-py3-none-//; s/\.whl//' <<<"$name") on glibc 2.31"; exit 1
fi
grep -q "is not a supported wheel on this platform" <<<"$out11" ||
  { echo "FAIL: pip's refusal does not name the platform"; exit 1; }
echo "wheel ok: installs and runs in a clean Debian 12 root (2 workers standalone, 2 nodes over gRPC; ldd: the C library only); refused by pip on Debian 11 (glibc 2.31) as not a supported platform"
