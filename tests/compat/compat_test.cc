// dlrun against torchrun itself: the same small real programs under both, and what each sees and
// does. torchrun is `python -m torch.distributed.run` of the project's torch (2.15, from
// scripts/install-deps); its flags are read from its own --help.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "multiproc/subprocess.h"
#include "nlohmann/json.hpp"
#include "test_paths.h"  // DLRUN_BIN, SOURCE_DIR, TEST_PYTHON...

namespace dlrun::testing {
namespace {

constexpr auto kDeadline = std::chrono::seconds(120);
const std::string kPython = TEST_PYTHON;
const std::string kCompat = std::string(SOURCE_DIR) + "/tests/compat/";

bool HaveTorch() {
  static const bool have = std::filesystem::exists(kPython) &&
                           RunCommand({kPython, "-c", "import torch.distributed"}).exit_code == 0;
  return have;
}

std::vector<std::string> Torchrun(std::vector<std::string> args) {
  std::vector<std::string> cmd = {kPython, "-m", "torch.distributed.run"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

std::vector<std::string> Dlrun(std::vector<std::string> args) {
  args.insert(args.begin(), DLRUN_BIN);
  return args;
}

// What every rank of a 4-worker run of env_probe.py saw.
std::vector<nlohmann::json> Probe(const std::vector<std::string>& launcher_and_flags,
                                  std::map<std::string, std::string> env) {
  const std::string out = MakeTempDir();
  std::vector<std::string> cmd = launcher_and_flags;
  cmd.push_back(kCompat + "env_probe.py");
  cmd.push_back(out);
  env["PYTHON_EXEC"] = kPython;  // dlrun's interpreter: torchrun's own one
  ProcResult r = RunCommand(cmd, env, kDeadline);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(out + "/" + std::to_string(rank) + ".json");
    ranks.push_back(in ? nlohmann::json::parse(in) : nlohmann::json());
  }
  return ranks;
}

#define REQUIRE_TORCH() \
  if (!HaveTorch()) GTEST_SKIP() << "torch is needed: " << kPython << " (scripts/install-deps)"

// The environment a launcher started with: this test's own plus the overrides it passes.
std::map<std::string, std::string> LauncherInput(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> in;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) in[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) in[k] = v;
  return in;
}

// The variables a launcher set or changed in a worker's environment.
std::map<std::string, std::string> SetByLauncher(const nlohmann::json& worker_env,
                                                 const std::map<std::string, std::string>& in) {
  std::map<std::string, std::string> set;
  for (const auto& [k, v] : worker_env.items()) {
    auto it = in.find(k);
    if (k != "_" && (it == in.end() || it->second != v.get<std::string>())) {
      set[k] = v.get<std::string>();
    }
  }
  return set;
}

// docs/COMPAT.md, where differences from torchrun are listed with their reason.
std::string CompatDoc() { return ReadFile(std::string(SOURCE_DIR) + "/docs/COMPAT.md"); }

TEST(Compat, EveryRankSeesWhatTorchrunGivesItOnANodeWithFourGpus) {
  REQUIRE_TORCH();
  const std::map<std::string, std::string> env = {{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}};
  auto theirs = Probe(Torchrun({"--standalone", "--nproc_per_node", "4"}), env);
  auto ours = Probe(Dlrun({"--standalone", "--nproc-per-node", "4"}), env);
  auto in = LauncherInput(env);
  in["PYTHON_EXEC"] = kPython;
  const std::string differs = CompatDoc();
  ASSERT_NE(differs.find("# torchrun compatibility"), std::string::npos) << "docs/COMPAT.md";
  for (int rank = 0; rank < 4; ++rank) {
    const nlohmann::json &a = ours[rank], &b = theirs[rank];
    ASSERT_FALSE(a.is_null() || b.is_null()) << "rank " << rank;
    // The standard line torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) finds its device.
    EXPECT_TRUE(a["set_device_local_rank_ok"].get<bool>()) << a.dump();
    EXPECT_EQ(a["env"]["CUDA_VISIBLE_DEVICES"], "0,1,2,3");
    EXPECT_TRUE(a["unbuffered"].get<bool>());
    // Every variable torchrun sets, dlrun sets to the same value, or docs/COMPAT.md names it
    // (`NAME`) with the reason it differs.
    const auto mine = SetByLauncher(a["env"], in);
    const auto torchruns = SetByLauncher(b["env"], in);
    EXPECT_GE(torchruns.size(), 15u) << "torchrun set too few variables to compare: " << b.dump();
    for (const auto& [k, v] : torchruns) {
      auto it = mine.find(k);
      ASSERT_NE(it, mine.end()) << k << "=" << v << " is set by torchrun, not by dlrun";
      if (it->second != v) {
        EXPECT_NE(differs.find("`" + k + "`"), std::string::npos)
            << k << ": torchrun '" << v << "', dlrun '" << it->second
            << "', and docs/COMPAT.md does not name it";
      }
    }
  }
}

TEST(Compat, OptInsNarrowEachWorkerToOneGpuAndLeastLoadedAsksNvml) {
  REQUIRE_TORCH();
  auto per_worker = Probe(Dlrun({"--standalone", "--nproc-per-node", "4", "--gpus", "per-worker"}),
                          {{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}});
  for (int rank = 0; rank < 4; ++rank) {
    // The documented consequence: each worker sees one device, index 0.
    EXPECT_EQ(per_worker[rank]["env"]["CUDA_VISIBLE_DEVICES"], std::to_string(4 + rank));
  }
  // A fake NVML: GPU 2 and 0 are the idle ones.
  auto least = Probe(Dlrun({"--standalone", "--nproc-per-node", "4", "--gpus", "least-loaded"}),
                     {{"DLRUN_NVML_LIBRARY", FAKE_NVML_LIB},
                      {"FAKE_NVML_GPUS", "100:1000:0,900:1000:90,0:1000:0,500:1000:50,800:1000:80"}});
  std::set<std::string> picked;
  for (const auto& r : least) picked.insert(r["env"]["CUDA_VISIBLE_DEVICES"].get<std::string>());
  EXPECT_EQ(picked, (std::set<std::string>{"0", "2", "3", "4"}));
}

TEST(Compat, AFailingRankIsTheRootCauseUnderBothAndItsErrorFileIsWritten) {
  REQUIRE_TORCH();
  const std::vector<std::string> program = {kCompat + "ddp_fail.py"};
  auto run = [&](std::vector<std::string> cmd) {
    cmd.insert(cmd.end(), program.begin(), program.end());
    return RunCommand(cmd, {{"PYTHON_EXEC", kPython}, {"OMP_NUM_THREADS", "1"}}, kDeadline);
  };
  for (const ProcResult& r : {run(Torchrun({"--standalone", "--nproc_per_node", "2"})),
                              run(Dlrun({"--standalone", "--nproc-per-node", "2"}))}) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const size_t root = r.output.find("Root Cause (first observed failure):");
    ASSERT_NE(root, std::string::npos) << r.output;
    const std::string block = r.output.substr(root);
    EXPECT_NE(block.find("rank      : 1 (local_rank: 1)"), std::string::npos) << r.output;
    EXPECT_NE(block.find("exitcode  : 1 (pid: "), std::string::npos) << r.output;
    EXPECT_NE(block.find("ValueError: rank 1 failed on purpose at step 2"), std::string::npos)
        << r.output;
    EXPECT_NE(block.find("host      : "), std::string::npos) << r.output;
    // The error file named in the block exists and holds the worker's exception.
    const size_t ef = block.find("error_file: ");
    ASSERT_NE(ef, std::string::npos);
    const std::string path = block.substr(ef + 12, block.find('\n', ef) - ef - 12);
    EXPECT_NE(ReadFile(path).find("rank 1 failed on purpose"), std::string::npos) << path;
  }
}

// Starts `cmd`, waits (deadline 20 s) for `needle` in its output while the worker still runs,
// then ends it.
bool ShowsWhileRunning(const std::vector<std::string>& cmd, const std::string& needle,
                       const std::map<std::string, std::string>& env = {}) {
  Started s = StartCommand(cmd, env);
  const bool seen = ReadUntil(s, needle, 1, std::chrono::seconds(20));
  kill(-s.pid, SIGKILL);
  FinishCommand(s, std::chrono::seconds(20));
  EXPECT_TRUE(seen) << "not shown while running: " << needle << "\noutput:\n" << s.output;
  return seen;
}

// `cmd` on a pseudo-terminal, as a person at a terminal runs it (util-linux script).
std::vector<std::string> OnATerminal(const std::vector<std::string>& cmd) {
  std::string line;
  for (const std::string& w : cmd) absl::StrAppend(&line, line.empty() ? "" : " ", "'", w, "'");
  // stdin from /dev/null: script copies its stdin to the terminal, and a test's stdin may be a
  // terminal that a background process group must not read.
  return {"sh", "-c", "exec script -qfec \"$0\" /dev/null </dev/null", line};
}

TEST(Compat, PythonOutputShowsAtOnceAndSurvivesACrash) {
  REQUIRE_TORCH();
  const std::map<std::string, std::string> env = {{"PYTHON_EXEC", kPython}};
  const std::string probe = kCompat + "output_probe.py";
  ShowsWhileRunning(Dlrun({"--standalone", probe, "line"}),
                    "[rank 0]: py-line-before-the-wait\n", env);
  ShowsWhileRunning(Torchrun({"--standalone", "--nproc_per_node", "1", probe, "line"}),
                    "py-line-before-the-wait\n", env);
  ProcResult r = RunCommand(Dlrun({"--standalone", probe, "crash"}), env, kDeadline);
  EXPECT_NE(r.output.find("[rank 0]: py-line-before-the-crash\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Signal 9 (SIGKILL) received by PID"), std::string::npos) << r.output;
}

TEST(Compat, OnATerminalACProgramsLinesAndProgressBarsShowLive) {
  REQUIRE_TORCH();
  // perl's stdout is block-buffered into a pipe and line-buffered on a terminal, like a C
  // program's: on a terminal dlrun gives it one, so the line shows before the program exits.
  ShowsWhileRunning(
      OnATerminal(Dlrun({"--standalone", "perl", "-e", "print qq(c-line\\n); sleep 120"})),
      "[rank 0]: c-line\r\n");  // the terminal shows \n as \r\n
  // What such a program wrote before it crashed is not lost.
  ProcResult crash = RunCommand(
      OnATerminal(Dlrun({"--standalone", "perl", "-e", "print qq(c-crash\\n); kill 9, $$"})),
      {}, kDeadline);
  EXPECT_NE(crash.output.find("[rank 0]: c-crash\r\n"), std::string::npos) << crash.output;
  // A tqdm-style bar: each '\r' redraw shows at once, prefixed, no newline needed.
  ShowsWhileRunning(OnATerminal(Dlrun({"--standalone", kCompat + "output_probe.py", "bar"})),
                    "\r[rank 0]: progress 20%|##", {{"PYTHON_EXEC", kPython}});
}

// Every option line of torchrun's own --help ("  --nproc-per-node NPROC_PER_NODE, --nproc_per_node
// NPROC_PER_NODE", "  -m, --module", "  --start-method {spawn,fork,forkserver}, ..."): each
// spelling with a value it takes when it takes one.
TEST(Compat, EveryFlagInTorchrunsOwnHelpIsAcceptedInEachSpelling) {
  REQUIRE_TORCH();
  ProcResult help = RunCommand({kPython, "-m", "torch.distributed.run", "--help"},
                               {{"COLUMNS", "400"}}, std::chrono::seconds(60));
  ASSERT_EQ(help.exit_code, 0) << help.output;
  const std::map<std::string, std::string> samples = {
      {"nnodes", "1"}, {"nproc-per-node", "2"}, {"rdzv-backend", "static"},
      {"rdzv-endpoint", "localhost:29500"}, {"rdzv-id", "job"}, {"rdzv-conf", "join_timeout=60"},
      {"max-restarts", "3"}, {"monitor-interval", "5"}, {"event-log-handler", "null"},
      {"role", "trainer"}, {"log-dir", "/tmp"}, {"redirects", "3"}, {"r", "3"}, {"tee", "3"},
      {"t", "3"}, {"log-line-prefix-template", "[${rank}]"}, {"local-ranks-filter", "0"},
      {"duplicate-stdout-filters", "a,b"}, {"duplicate-stderr-filters", "a,b"},
      {"node-rank", "0"}, {"master-addr", "127.0.0.1"}, {"master-port", "29500"},
      {"local-addr", "127.0.0.1"}, {"logs-specs", "default"},
      {"signals-to-handle", "SIGTERM,SIGINT"}, {"shutdown-timeout", "10"}};
  std::istringstream lines(help.output.substr(help.output.find("options:")));
  std::string line;
  int checked = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("  -", 0) != 0) continue;  // option lines start with two spaces and a dash
    // Up to the help text (two or more spaces), then split the spellings at ", ".
    std::string spec = line.substr(2, line.find("  ", 2) - 2);
    for (absl::string_view item : absl::StrSplit(spec, ", ")) {
      std::vector<std::string> words = absl::StrSplit(item, ' ');
      const std::string flag = words[0];
      if (flag == "-h" || flag == "--help") continue;
      std::string name = flag.substr(flag.find_first_not_of('-'));
      std::replace(name.begin(), name.end(), '_', '-');
      std::vector<std::string> cmd = {DLRUN_BIN, "env", flag};
      if (words.size() > 1) {  // takes a value: a choice {a,b} or a METAVAR
        if (words[1][0] == '{') {
          cmd.push_back(words[1].substr(1, words[1].find_first_of(",}") - 1));
        } else {
          auto it = samples.find(name);
          ASSERT_NE(it, samples.end()) << "torchrun has a flag this test has no value for: "
                                       << flag << " (add one to `samples`)";
          cmd.push_back(it->second);
        }
      }
      ProcResult r = RunCommand(cmd, {}, std::chrono::seconds(30));
      EXPECT_EQ(r.exit_code, 0) << absl::StrJoin(cmd, " ") << ": " << r.output;
      ++checked;
    }
  }
  EXPECT_GE(checked, 50) << "too few flags read from torchrun --help:\n" << help.output;
}

TEST(Compat, EveryTorchrunFlagIsAccepted) {
  // Each flag of torchrun (1.13's run.py plus 2.x's additions) with a value it takes, in its
  // own underscore spelling, on `dlrun env` (parses and detects, starts nothing).
  const std::vector<std::vector<std::string>> flags = {
      {"--nnodes", "1"}, {"--nproc_per_node", "2"}, {"--rdzv_backend", "static"},
      {"--rdzv_endpoint", "localhost:29500"}, {"--rdzv_id", "job"},
      {"--rdzv_conf", "join_timeout=60,read_timeout=60,keep_alive_interval=5"},
      {"--standalone"}, {"--max_restarts", "3"}, {"--monitor_interval", "5"},
      {"--start_method", "spawn"}, {"--role", "trainer"}, {"-m"}, {"--module"},
      {"--no_python"}, {"--run_path"}, {"--log_dir", "/tmp"}, {"-r", "3"}, {"--redirects", "1"},
      {"-t", "3"}, {"--tee", "0:3"}, {"--node_rank", "0"}, {"--master_addr", "127.0.0.1"},
      {"--master_port", "29500"}, {"--local_addr", "127.0.0.1"},
      {"--local_ranks_filter", "0"}, {"--logs_specs", "default"},
      {"--signals_to_handle", "SIGTERM,SIGINT"}, {"--numa_binding", "node"},
      {"--event_log_handler", "null"}, {"--nproc_per_node", "auto"}};
  for (const auto& f : flags) {
    std::vector<std::string> cmd = {DLRUN_BIN, "env"};
    cmd.insert(cmd.end(), f.begin(), f.end());
    ProcResult r = RunCommand(cmd, {}, std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 0) << f[0] << ": " << r.output;
  }
  // Spelled with dashes too, and the etcd backends get a line saying what to use.
  EXPECT_EQ(RunCommand({DLRUN_BIN, "env", "--start-method=forkserver"}).exit_code, 0);
  ProcResult etcd = RunCommand({DLRUN_BIN, "env", "--rdzv_backend", "etcd-v2"});
  EXPECT_EQ(etcd.exit_code, 2);
  EXPECT_NE(etcd.output.find("use --rdzv-backend c10d"), std::string::npos) << etcd.output;
}

TEST(Compat, LogDirsHaveTorchrunsLayoutAndTwoRunsKeepBoth) {
  REQUIRE_TORCH();
  auto layout = [](const std::string& dir) {  // the relative paths of the log files
    std::set<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (!e.is_regular_file()) continue;
      std::string rel = std::filesystem::relative(e.path(), dir).string();
      const size_t slash = rel.find('/');
      rel = slash == std::string::npos ? rel : rel.substr(slash);  // drop <run_id>_<random>
      files.insert(rel);
    }
    return files;
  };
  const std::string torch_logs = MakeTempDir(), our_logs = MakeTempDir();
  const std::map<std::string, std::string> env = {{"PYTHON_EXEC", kPython}};
  const std::string probe = kCompat + "output_probe.py";
  ASSERT_EQ(RunCommand(Torchrun({"--standalone", "--nproc_per_node", "1", "--log_dir", torch_logs,
                                 "-r", "3", "--no_python", "sh", "-c", "echo hi"}),
                       env, kDeadline).exit_code, 0);
  for (int run = 0; run < 2; ++run) {
    ASSERT_EQ(RunCommand(Dlrun({"--standalone", "--log-dir", our_logs, "-r", "3", "sh", "-c",
                                "echo hi"}),
                         env, kDeadline).exit_code, 0);
  }
  const auto theirs = layout(torch_logs);
  EXPECT_TRUE(theirs.count("/attempt_0/0/stdout.log")) << *theirs.begin();
  const auto ours = layout(our_logs);
  for (const std::string& f : theirs) EXPECT_TRUE(ours.count(f)) << f;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(our_logs),
                          std::filesystem::directory_iterator()),
            2);  // one directory per run
}

}  // namespace
}  // namespace dlrun::testing
