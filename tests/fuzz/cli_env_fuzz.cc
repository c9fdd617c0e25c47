// libFuzzer: the dlrun command line and environment detection. The input is NUL-separated
// words; words of the form K=V after a lone "--env" are the environment. The PMIx server's
// answer is made from the same variables (FUZZ_PMIX_*), so no server is contacted.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "launcher/detect/env_detect.h"
#include "launcher/jobgen/job_script.h"
#include "launcher/cli/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::map<std::string, std::string> vars;
  bool in_env = false;
  std::string cur;
  auto flush = [&] {
    if (cur == "--env") {
      in_env = true;
    } else if (in_env) {
      const auto eq = cur.find('=');
      if (eq != std::string::npos) vars[cur.substr(0, eq)] = cur.substr(eq + 1);
    } else {
      args.push_back(cur);
    }
    cur.clear();
  };
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      flush();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  flush();
  dlrun::EnvLookup env = [&](std::string_view n) -> std::optional<std::string> {
    auto it = vars.find(std::string(n));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  auto o = dlrun::launcher::ParseLaunchOptions(args, env);
  if (o.ok()) {
    const auto pmix = [&]() -> absl::StatusOr<dlrun::launcher::PmixJob> {
      if (vars.count("FUZZ_PMIX_FAIL")) return absl::UnavailableError("fuzz");
      const auto str = [&](const char* k) {
        auto it = vars.find(k);
        return it == vars.end() ? std::string() : it->second;
      };
      const auto num = [&](const char* k) -> std::optional<uint32_t> {
        if (!vars.count(k)) return std::nullopt;
        return static_cast<uint32_t>(std::strtoul(str(k).c_str(), nullptr, 10));
      };
      dlrun::launcher::PmixJob job;
      job.nspace = str("PMIX_NAMESPACE");
      job.rank = num("PMIX_RANK").value_or(0);
      job.job_size = num("FUZZ_PMIX_JOB_SIZE");
      job.local_size = num("FUZZ_PMIX_LOCAL_SIZE");
      job.node_list = str("FUZZ_PMIX_NODE_LIST");
      job.rank0_host = str("FUZZ_PMIX_HOSTNAME");
      return job;
    };
    auto d = dlrun::launcher::DetectEnvironment(env, *o, pmix);
    if (d.ok()) (void)dlrun::launcher::FormatDetection(*d);
  }
  // The same words as `dlrun slurm` / `dlrun runai` arguments.
  if (auto s = dlrun::launcher::ParseSlurmArgs(args); s.ok()) {
    (void)dlrun::launcher::RenderSlurmScript(*s, "{{SBATCH_LINES}}\n{{PROGRAM}}\n{{DLRUN_EXTRA}}");
  }
  if (auto r = dlrun::launcher::ParseRunaiArgs(args); r.ok()) {
    (void)dlrun::launcher::RenderRunaiCommand(*r);
    (void)dlrun::launcher::RenderRunaiManifest(*r);
  }
  return 0;
}
