#!/usr/bin/env bash
# scripts/check-structure catches each kind of breach (docs/ARCHITECTURE.md, "Rules the build
# checks"): in a small tree made here, a launcher folder that includes a folder it does not
# declare, a library below the launcher that includes it, a function of 81 lines, a file of
# 501, a function-try-block of 81 (to its last handler), and a tracked core dump, ELF file and
# .pyc, a class over its bounds, a class defined across two .cc files, a camelCase public function, and a launcher folder, gRPC
# service or RPC that docs/ARCHITECTURE.md does not name; and the same tree without them passes.
set -euo pipefail
checker=${1:?usage: check_structure_test.sh scripts/check-structure}
root=$(mktemp -d "${TMPDIR:-/tmp}/check-structure.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/launcher/{base,cli,agent} "$root"/telemetry
cat > "$root/launcher/CMakeLists.txt" <<'CMAKE'
dlrun_launcher_folder(base
  SOURCES base/a.cc)
dlrun_launcher_folder(cli
  SOURCES cli/flags.cc
  DEPS base)
dlrun_launcher_folder(agent
  SOURCES agent/agent.cc
  DEPS base cli)
CMAKE
printf '#include "launcher/base/a.h"\nint F() { return 1; }\n' > "$root/launcher/cli/flags.cc"
printf '#include "launcher/cli/flags.h"\n#include "launcher/base/a.h"\n' > "$root/launcher/agent/agent.cc"
printf 'int A() { return 0; }\n' > "$root/launcher/base/a.cc"
printf '#include "telemetry/telemetry.h"\n' > "$root/telemetry/telemetry.cc"

out=$("$checker" --root "$root") || { echo "FAIL: a clean tree was refused: $out"; exit 1; }
echo "ok: a clean tree passes"

expect() {  # expect WHAT PATTERN: the checker exits 1 and prints PATTERN
  local what=$1 pattern=$2 rc=0
  out=$("$checker" --root "$root" 2>&1) || rc=$?
  if [[ $rc -ne 1 ]] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: $what: rc $rc, output:"; echo "$out"; exit 1
  fi
  echo "ok: $what: $(grep -- "$pattern" <<<"$out" | head -1)"
}

# The wrong way: cli is below agent.
printf '#include "launcher/agent/agent.h"\n' >> "$root/launcher/cli/flags.cc"
expect "a wrong-way include" "launcher/cli/flags.cc: includes launcher/agent/, not among launcher/cli's DEPS (base)"
sed -i '$d' "$root/launcher/cli/flags.cc"
# A folder without a target.
mkdir -p "$root/launcher/extra" && printf 'int X();\n' > "$root/launcher/extra/x.h"
expect "a folder without a target" "launcher/extra/ has no dlrun_launcher_folder() target"
rm -r "$root/launcher/extra"
# Below the launcher.
printf '#include "launcher/cli/flags.h"\n' >> "$root/telemetry/telemetry.cc"
expect "a library below the launcher including it" "telemetry/telemetry.cc: includes launcher/cli/, but telemetry/ is below the launcher"
sed -i '$d' "$root/telemetry/telemetry.cc"
# An 81-line function, with a lambda and a string holding a brace inside.
{ echo 'int Long() {'; echo '  auto f = [] { return "}"; };'; for i in $(seq 1 78); do echo "  f();"; done; echo '}'; } \
  >> "$root/launcher/base/a.cc"
expect "a function over 80 lines" "launcher/base/a.cc:2: Long is 81 lines, over 80"
# ...and one of 80 passes.
sed -i '4d' "$root/launcher/base/a.cc"
out=$("$checker" --root "$root") || { echo "FAIL: an 80-line function was refused: $out"; exit 1; }
echo "ok: an 80-line function passes"
# A file of 451 lines.
for i in $(seq 1 451); do echo "// $i"; done > "$root/launcher/base/long.h"
expect "a file over 450 lines" "launcher/base/long.h: 451 lines, over 450"
rm "$root/launcher/base/long.h"
# A function-try-block counts to the end of its last handler: 78 lines of body, a 3-line handler.
{ echo 'int Main() try {'; for i in $(seq 1 77); do echo "  F();"; done
  echo '} catch (...) {'; echo '  return 1;'; echo '}'; } > "$root/launcher/base/m.cc"
expect "a function-try-block over 80 lines" "launcher/base/m.cc:1: Main is 81 lines, over 80"
sed -i '2d' "$root/launcher/base/m.cc"
out=$("$checker" --root "$root") || { echo "FAIL: an 80-line function-try-block was refused: $out"; exit 1; }
echo "ok: an 80-line function-try-block passes"
rm "$root/launcher/base/m.cc"
# Tracked by mistake (a git checkout): a core dump, an ELF file, a .pyc; untracked ones pass.
git -C "$root" init -q && git -C "$root" add -A
printf '\177ELF\002\001\001' > "$root/core"
mkdir -p "$root/bench/__pycache__" && printf 'x' > "$root/bench/__pycache__/a.cpython-311.pyc"
cp /bin/true "$root/launcher/base/tool"
out=$("$checker" --root "$root") || { echo "FAIL: untracked build output was refused: $out"; exit 1; }
echo "ok: untracked core, ELF and .pyc pass"
git -C "$root" add -f core && expect "a tracked core dump" "^core: tracked, and it is a core dump"
git -C "$root" rm -q --cached core
git -C "$root" add -f launcher/base/tool && expect "a tracked ELF file" "^launcher/base/tool: tracked, and it is an ELF file"
git -C "$root" rm -q --cached launcher/base/tool
git -C "$root" add -f bench/__pycache__ && expect "a tracked .pyc" "^bench/__pycache__/a.cpython-311.pyc: tracked, and it is compiled Python"
git -C "$root" rm -q -r --cached bench/__pycache__
rm -rf "$root/.git" "$root/core" "$root/bench" "$root/launcher/base/tool"
# Class sizes: 26 member functions (a constructor, declarations, one defined in the class, an
# operator) or 26 data members (`int a_, b_;` counts two; static members, nested types and
# aliases none) are over; 25 of each pass; a plain struct of data may hold more; the Agent has
# a bound of 15.
klass() {  # klass NAME KEYWORD METHODS FIELDS: a header declaring it
  local name=$1 kw=$2 m=$3 f=$4 i
  echo "$kw $name {"; echo " public:"
  ((m > 0)) && echo "  $name();" && echo "  int Inline() const { return 1; }" &&
    echo "  bool operator==(const $name&) const = default;"
  for ((i = 3; i < m; i++)); do echo "  void M$i(int a, std::function<void(int)> f);"; done
  echo "  using Alias = int;"; echo "  static constexpr int kStatic = 1;"
  echo "  struct Nested { int x, y, z; };"; echo "  enum class Kind { kA, kB };"
  echo " private:"
  for ((i = 0; i + 1 < f; i += 2)); do echo "  int f${i}_ = 0, g${i}_{2};"; done
  ((f % 2)) && echo "  std::map<int, std::pair<int, int>> last_;"
  echo "};"
}
klass Big class 26 25 > "$root/launcher/base/big.h"
expect "a class over 25 member functions" "launcher/base/big.h:1: class Big has 26 member functions, over 25"
klass Big class 25 26 > "$root/launcher/base/big.h"
expect "a class over 25 data members" "launcher/base/big.h:1: class Big has 26 data members, over 25"
klass Big class 25 25 > "$root/launcher/base/big.h"
out=$("$checker" --root "$root") || { echo "FAIL: a class of 25 and 25 was refused: $out"; exit 1; }
echo "ok: a class of 25 member functions and 25 data members passes"
# One class, one .cc: Big's members defined in two files is a breach; a nested class's members
# (Big::Part::) in another file are another class's, and a namespace-qualified free function
# (detail::) is no class's.
printf '#include "launcher/base/big.h"\nBig::Big() {}\nvoid Big::M3(int a, std::function<void(int)> f) {}\n' > "$root/launcher/base/big.cc"
printf '#include "launcher/base/big.h"\nint Big::Part::Count() const { return 2; }\nvoid detail::Helper(int x) {}\n  Big::M4(1, nullptr);\n' > "$root/launcher/base/big_part.cc"
out=$("$checker" --root "$root") || { echo "FAIL: one class in one .cc was refused: $out"; exit 1; }
echo "ok: a class's members in one .cc, a nested class's and a free function's in another pass"
printf 'void Big::M5(int a, std::function<void(int)> f) {\n}\n' >> "$root/launcher/base/big_part.cc"
expect "a class defined across two .cc files" "class Big: member functions defined in 2 files (launcher/base/big.cc, launcher/base/big_part.cc): one class, one .cc"
rm "$root/launcher/base/big.cc" "$root/launcher/base/big_part.cc"
klass Options struct 0 45 > "$root/launcher/base/big.h"
out=$("$checker" --root "$root") || { echo "FAIL: a plain struct of 45 was refused: $out"; exit 1; }
echo "ok: a plain struct of 45 data members passes"
klass Agent class 16 10 > "$root/launcher/base/big.h"
expect "an Agent over 15 member functions" "launcher/base/big.h:1: class Agent has 16 member functions, over 15"
rm "$root/launcher/base/big.h"
# The worker library's public API: snake_case functions (its detail namespace aside).
mkdir -p "$root/worker/include/dlrun"
printf 'namespace dlrun::worker {\nnamespace detail {\nvoid HelperOne();\nvoid innerWay();\n}  // namespace detail\n// resumeLatest() in a comment\nvoid resume_latest();\nint ctx_world(Context& c) { return c.worldSize(); }\n}\n' > "$root/worker/include/dlrun/api.h"
out=$("$checker" --root "$root") || { echo "FAIL: snake_case names were refused: $out"; exit 1; }
echo "ok: snake_case functions, a camelCase call of another's and detail's names pass"
printf 'namespace dlrun::worker {\nstruct S {\n  void bucketReport() const;\n};\n}\n' > "$root/worker/include/dlrun/api.h"
expect "a camelCase method in the public API" "worker/include/dlrun/api.h:3: 'bucketReport': the public API's functions are snake_case"
rm -r "$root/worker"
# docs/ARCHITECTURE.md, the map: every launcher folder on a line of its own, every gRPC service
# with its RPCs.
mkdir -p "$root/docs" "$root/proto"
printf 'service Membership {\n  rpc Join(A) returns (B);\n  rpc Leave(A) returns (B);\n}\n' > "$root/proto/x.proto"
printf '# Map\n```\nlauncher/\n  base/   the leaf\n  cli/    flags\n  agent/  the loop\n```\nMembership (Join, Leave)\n' > "$root/docs/ARCHITECTURE.md"
out=$("$checker" --root "$root") || { echo "FAIL: a map naming everything was refused: $out"; exit 1; }
echo "ok: a map that names every folder, service and RPC passes"
mkdir -p "$root/launcher/recovery" && printf 'int R();\n' > "$root/launcher/recovery/r.h"
printf 'dlrun_launcher_folder(recovery\n  SOURCES recovery/r.cc\n  DEPS base)\n' >> "$root/launcher/CMakeLists.txt"
expect "a launcher folder the map does not name" "docs/ARCHITECTURE.md: launcher/recovery/ is not in the Components map"
printf '  recovery/  in-process recovery\n' >> "$root/docs/ARCHITECTURE.md"
printf 'service Regroup {\n  rpc Ask(A) returns (B);\n}\n' >> "$root/proto/x.proto"
expect "a gRPC service the map does not name" "docs/ARCHITECTURE.md: the service Regroup (proto/x.proto) is not named"
printf 'Regroup\n' >> "$root/docs/ARCHITECTURE.md"
expect "an RPC the map does not name" "docs/ARCHITECTURE.md: the RPC Regroup.Ask (proto/x.proto) is not named"
echo "check-structure catches every kind of breach"
