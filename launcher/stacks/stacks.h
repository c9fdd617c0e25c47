// Job-wide stack dumps (docs/STACKS.md): what one rank's stack is, how a node dumps its workers
// (py-spy for Python workers, eu-stack for native ones, all at once, bounded), and how the
// ranks of a job are grouped by stack so the odd ones out (the suspects) stand out.
// Used by `dlrun stacks` (app/stacks_main.cc) and by the agent's capture before kill.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launcher/base/file_system.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launcher/base/capture_mode.h"

namespace dlrun::launcher {

struct StackFrame {
  std::string function;  // "??" when unknown
  std::string file;      // source file, else the module (native frames without line info)
  int line = 0;          // 0: unknown
  // Native frames before SymbolizeStacks: the module's path and the address's offset in it.
  std::string module;
  uint64_t offset = 0;
  // "file:line function", or "function (module)" without a line.
  std::string Render() const;
};

struct StackThread {
  std::string name;                // py-spy's thread name, or "TID n"
  std::vector<StackFrame> frames;  // innermost first
};

// One rank's dump, or why there is none.
struct RankStack {
  int rank = -1;
  int local_rank = -1;
  std::string host;
  pid_t pid = -1;
  std::string tool;                  // "py-spy" or "eu-stack"
  std::vector<StackThread> threads;  // the main thread first
  std::string missing;               // why the stack could not be read; empty when read
  // How long the rank was held still for its dump: py-spy reads without stopping (0); eu-stack
  // attaches, so its whole run counts.
  double pause_ms = 0;
};

// A worker to dump.
struct DumpTarget {
  int rank = -1;
  int local_rank = -1;
  pid_t pid = -1;
};

// The dump tools. Empty: not found (the rank is then `missing`, naming the tool).
struct StackTools {
  std::string py_spy;    // contract::kPySpy, else next to the worker's interpreter, else PATH
  std::string eu_stack;  // contract::kEuStack, else PATH (Debian's elfutils)
  std::string eu_addr2line;  // beside eu-stack, else PATH
};
StackTools FindStackTools();
// The executable `name` in a directory of PATH, or empty.
std::string OnPath(const std::string& name);
// Whether `path` names a file this process may execute.
bool Executable(const std::string& path);
// The interpreter process `pid` was started with (argv[0] of /proc/PID/cmdline, made absolute
// against its working directory when it has a directory part; as given, e.g. "python3", when
// it has none), for the py-spy of its own environment (a venv's bin/ has it next to python);
// empty when it cannot be read.
std::string InterpreterOf(pid_t pid);

// Dumps every target at once (one tool process each) within `bound`: a tool still running then
// is killed and its rank reported missing ("did not finish"). Python workers (the executable is
// python*) through `py-spy dump --nonblocking` (every thread's Python frames, the worker never
// stopped); the others through `eu-stack -q` (native frames: the worker is stopped only while
// its threads are unwound). `symbolize`: then names the native frames (SymbolizeStacks); the
// capture before kill does that after the group is stopped instead.
std::vector<RankStack> DumpStacks(const std::vector<DumpTarget>& targets, const StackTools& tools,
                                  const std::string& host, std::chrono::milliseconds bound,
                                  bool symbolize = true);
// Names the native frames of a dump (function, source file and line where there is debug
// information) with eu-addr2line, one process per module, all at once, within `bound`. The
// workers are not touched: only their files on disk are read.
void SymbolizeStacks(std::vector<RankStack>* ranks, const StackTools& tools,
                     std::chrono::milliseconds bound);

// Parsers of the tools' output (unit-tested on saved output).
absl::StatusOr<std::vector<StackThread>> ParsePySpyJson(const std::string& text, pid_t pid);
std::vector<StackThread> ParseEuStack(const std::string& text, pid_t pid);
// "file:line" or "file:line:column" into `f`; false (f unchanged) when it is neither ("??:0").
bool SetSourceLocation(absl::string_view src, StackFrame* f);

// The job's stacks, grouped: ranks whose main threads have the same frames share one group,
// smallest groups first. The suspects are the ranks outside the largest group (its ties go to
// the group with the lowest rank); none when every rank read has the same stack.
struct StackGroup {
  std::vector<int> ranks;
  std::vector<std::string> hosts;
  std::vector<std::string> frames;  // the main thread's, rendered, innermost first
};
struct StackReport {
  std::vector<StackGroup> groups;
  std::vector<int> suspects;
  std::vector<RankStack> ranks;  // everything read, by rank; `missing` ones included
  // Nodes of a job-wide dump that did not answer: host name and why.
  std::vector<std::pair<std::string, std::string>> missing_nodes;
  double took_s = 0;
  // The job read, as `dlrun stacks` found it ("dlrun-3f2a... (agent pid 4242)"): a job chosen
  // among the live ones of this node is named, so another job's stacks never pass for yours.
  std::string job;
};
StackReport GroupStacks(std::vector<RankStack> ranks);

// {"groups": [{"ranks", "hosts", "frames"}], "suspects": [..], "missing": [{"rank", "host",
// "why"}], "took_s", "ranks": [every rank's threads, structured]} (docs/STACKS.md).
std::string StackReportJson(const StackReport& r, int indent = -1);
// The "ranks" of such a JSON object (or a bare array of them): how nodes send their dumps.
absl::StatusOr<std::vector<RankStack>> RankStacksFromJson(const std::string& text);
std::string RankStacksJson(const std::vector<RankStack>& ranks);
// The same within `max_bytes`: only the main threads, their innermost frames as many as fit.
std::string RankStacksJson(std::vector<RankStack> ranks, size_t max_bytes);

// A dump in a few KB, for the live page and /api/job (at most `max_bytes`): when (wall time),
// where and why, the suspects, the missing ranks, and each group with its innermost frames.
std::string StackSummaryJson(const StackReport& r, const std::string& host, const std::string& why,
                             double when_s, size_t max_bytes = 16 * 1024);

// For people: the suspects, then each group ("ranks 0-2,4-7 (node a, b):" and its frames),
// then the missing ranks.
std::string FormatStackReport(const StackReport& r);

// Where the ranks other than `rank` were, in one phrase: "the other 7 ranks were in all_reduce
// at train.py:45" (the innermost frame outside the Python library and site-packages and its
// callee), grouped when they were in different places. Empty when nothing was read.
std::string WhereTheOthersWere(const StackReport& r, int rank);

// "all_reduce at train.py:45": the program's innermost line (outside the Python library and
// site-packages) and what it called there; else the innermost named frame.
std::string WhereInProgram(const std::vector<StackFrame>& frames);

// Which ranks hold a hung group up, from a dump of every rank (hang_verdict.cc): a rank whose
// main thread is in a collective (a frame of torch.distributed or of autograd's backward, or a
// native Gloo, NCCL, c10d or all-reduce frame) waits for the others; the ranks that are not,
// and those stopped by a signal (`stopped`), are the culprits. None when every rank waits (a
// rank may be gone) or nothing was read.
struct HangVerdict {
  std::vector<int> culprits;
  // Where each rank is, culprits first: "rank 1 is in sleep at hang.py:10; rank 0 waits in
  // all_reduce at hang.py:12".
  std::string where;
  bool all_wait = false;  // every rank read waits in a collective (and none is stopped)
};
HangVerdict NameHung(const StackReport& r, const std::vector<int>& stopped);

// Which ranks hold a hung group up when their stacks could not be read (no py-spy): from the
// system call each rank's main thread is blocked in (/proc/PID/syscall's text, by rank). A futex
// wait is a thread waiting for another one, as a collective waits for its communication threads;
// a rank blocked in another call (a sleep, a read of its own) or running is in its own work.
// Those ranks when some but not all are; else none (the calls do not tell them apart).
std::vector<int> HoldersBySyscall(const std::map<int, std::string>& blocked_call_by_rank);

// "0-2,4,6-7".
std::string RankRanges(std::vector<int> ranks);
// "rank 2", "ranks 0-1,3".
std::string RanksPhrase(const std::vector<int>& ranks);

// What the agent tells `dlrun stacks` about its run: RUN_DIR/workers.json, rewritten (atomically)
// whenever a worker group starts.
struct WorkersFile {
  std::string run_id;
  std::string host;
  pid_t agent_pid = -1;
  int attempt = 0;
  std::vector<DumpTarget> workers;
  // A multi-node job's rendezvous (the current host) and its secret, for a job-wide dump; the
  // file is then readable by its owner only.
  std::string rdzv_endpoint;
  std::string rdzv_token;
};
inline constexpr char kWorkersFileName[] = "workers.json";
// The capture before kill, in RUN_DIR/attempt_K/ (with stacks.txt for people).
inline constexpr char kStacksJsonName[] = "stacks.json";
absl::Status WriteWorkersFile(FileSystem& fs, const std::string& run_dir, const WorkersFile& w);
absl::StatusOr<WorkersFile> ReadWorkersFile(const std::string& path);

}  // namespace dlrun::launcher
