// `dlrun slurm` and `dlrun runai`: the subcommands that write job scripts and manifests.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/base/bad_nodes.h"
#include "launcher/base/file_system.h"
#include "common/contract.h"
#include "launcher/app/commands.h"
#include "launcher/cli/flags.h"
#include "launcher/jobgen/job_script.h"
#include "launcher/jobgen/shell.h"

namespace dlrun::launcher {

extern const char* const kSlurmTemplate;  // job_templates/dlrun.sbatch, compiled in

namespace {

// Writes `text` to `path` with exactly `mode` (also when the file already existed).
bool WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  bool ok = ::fchmod(fd, mode) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    done += ok ? static_cast<size_t>(n) : 0;
  }
  const int write_errno = errno;
  if (::close(fd) != 0) return false;
  errno = write_errno;
  return ok;
}

// `sbatch --parsable PATH`: the job id, or an error naming the script.
absl::StatusOr<std::string> Submit(const std::string& path) {
  const std::string cmd = absl::StrCat("sbatch --parsable ", ShellQuote(path));
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::InternalError("cannot run sbatch");
  char buf[256];
  std::string out;
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = pclose(p);
  if (status != 0) {
    return absl::FailedPreconditionError(absl::StrCat("sbatch failed (exit status ",
                                                      WEXITSTATUS(status), ") for ", path,
                                                      "; see its message above"));
  }
  return out.substr(0, out.find_first_of(";\n"));
}

// --preemptible for a Python script that neither uses dlrun_report.Preemption() nor catches
// SIGUSR1: the warning would end its workers instead of a checkpoint and requeue.
void WarnWithoutPreemptionHook(const std::vector<std::string>& command) {
  const std::string script = PythonScriptOf(command);
  if (script.empty()) return;
  std::ifstream in(script);
  if (!in) return;  // not readable here (it may be on the nodes only): cannot tell
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (UsesPreemptionHook(source)) return;
  std::fprintf(stderr,
               "dlrun slurm: warning: --preemptible, but %s neither uses "
               "dlrun_report.Preemption() nor catches SIGUSR1: on the warning its workers will "
               "exit instead of checkpointing and requeueing the job (docs/USAGE.md, "
               "Preemption)\n",
               script.c_str());
}

// The user's bad-node list joins --exclude (one line says which hosts).
void ExcludeBadNodes(SlurmJobOptions* o) {
  const auto bad = ReadBadNodes(PosixFileSystem(), BadNodesPath());
  std::vector<std::string> hosts = absl::StrSplit(o->exclude, ',', absl::SkipEmpty());
  std::vector<std::string> added;
  for (const BadNode& n : bad) {
    if (std::find(hosts.begin(), hosts.end(), n.host) != hosts.end()) continue;
    hosts.push_back(n.host);
    added.push_back(n.host);
  }
  if (added.empty()) return;
  o->exclude = absl::StrJoin(hosts, ",");
  o->bad_nodes = static_cast<int>(added.size());
  std::fprintf(stderr, "dlrun: excluding %s, found bad before (dlrun bad-nodes lists them, "
               "--clear forgets them)\n", absl::StrJoin(added, ",").c_str());
}

}  // namespace

int SlurmMain(const std::vector<std::string>& args) {
  auto o = ParseSlurmArgs(args);
  if (!o.ok()) return Fail(o.status());
  if (o->help) return Print(SlurmUsage());
  if (o->version) return Print(cli::VersionText());
  if (o->dlrun_path == "dlrun") o->dlrun_path = SelfPath();
  if (o->preemptible) WarnWithoutPreemptionHook(o->command);
  for (const std::string& w : ContainerWarnings(*o)) {
    std::fprintf(stderr, "dlrun: warning: %s\n", w.c_str());
  }
  ExcludeBadNodes(&*o);
  const std::string script = RenderSlurmScript(*o, kSlurmTemplate);
  std::string path = o->script_path;
  if (path.empty() && o->submit) path = absl::StrCat("dlrun-", o->job_name, ".sbatch");
  if (path.empty() || path == "-") {
    std::fputs(script.c_str(), stdout);
    return 0;
  }
  if (!WriteFile(path, script, 0755)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot write the job script to '", path, "': ", std::strerror(errno))));
  }
  const std::string page =
      o->metrics_port > 0
          ? absl::StrCat("dlrun: when it runs, point a browser at http://<its first node>:",
                         o->metrics_port, "/ (the job's output prints the address)\n")
          : "";
  if (!o->submit) {
    std::fprintf(stderr, "dlrun: wrote %s (submit with: sbatch %s)\n%s", path.c_str(),
                 path.c_str(), page.c_str());
    return 0;
  }
  auto id = Submit(path);
  if (!id.ok()) return Fail(id.status());
  std::printf("%s\n", id->c_str());
  std::fprintf(stderr, "dlrun: submitted %s as job %s\n%s", path.c_str(), id->c_str(),
               page.c_str());
  return 0;
}

int RunaiMain(const std::vector<std::string>& args) {
  auto o = ParseRunaiArgs(args);
  if (!o.ok()) return Fail(o.status());
  if (o->help) return Print(RunaiUsage());
  if (o->version) return Print(cli::VersionText());
  for (const std::string& w : o->warnings) std::fprintf(stderr, "dlrun: warning: %s\n", w.c_str());
  for (const BadNode& n : ReadBadNodes(PosixFileSystem(), BadNodesPath())) {
    o->avoid_nodes.push_back(n.host);
  }
  if (!o->avoid_nodes.empty()) {
    std::fprintf(stderr,
                 "dlrun: %s found bad before (dlrun bad-nodes): the manifest (-o) keeps the pods "
                 "off them; the runai command line cannot\n",
                 absl::StrJoin(o->avoid_nodes, ",").c_str());
  }
  std::fputs(RenderRunaiCommand(*o).c_str(), stdout);
  const std::string token_prefix = absl::StrCat(contract::kRdzvToken, "=");
  bool token = false;
  for (const std::string& e : o->env) token = token || e.rfind(token_prefix, 0) == 0;
  if (!token) {
    std::fprintf(stderr,
                 "dlrun: warning: the runai command sets no rendezvous token, so any pod that "
                 "reaches the rendezvous port can join the job; add -e %s<secret> (the manifest "
                 "of -o FILE has one in its Secret)\n",
                 token_prefix.c_str());
  }
  if (!o->manifest_path.empty()) {
    // 0600: the manifest holds the job's token in its Secret.
    if (!WriteFile(o->manifest_path, RenderRunaiManifest(*o), 0600)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "cannot write the manifest to '", o->manifest_path, "': ", std::strerror(errno))));
    }
    std::fprintf(stderr, "dlrun: wrote %s (kubectl apply -f %s)\n", o->manifest_path.c_str(),
                 o->manifest_path.c_str());
  }
  return 0;
}

}  // namespace dlrun::launcher
