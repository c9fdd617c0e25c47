// Helpers shared by the job generators (`dlrun slurm`, `dlrun runai`): quoting for the shell and
// values that go into #SBATCH lines or YAML scalars.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/cli/flags.h"

namespace dlrun::launcher {

// POSIX shell quoting: the word unchanged if it is safe, else in single quotes.
std::string ShellQuote(const std::string& word);
// The words quoted and joined by spaces.
std::string JoinCommand(const std::vector<std::string>& cmd);
// `bytes` random bytes as hex (tokens).
std::string RandomHex(int bytes);

// A value that goes into an #SBATCH line or a YAML scalar: printable, no spaces or quotes.
absl::Status PlainWord(const std::string& flag, const std::string& v);

template <typename Opts>
cli::Setter<Opts> WordField(const std::string& flag, std::string Opts::*field) {
  return [=](Opts& o, const std::string& v) {
    if (absl::Status s = PlainWord(flag, v); !s.ok()) return s;
    o.*field = v;
    return absl::OkStatus();
  };
}

}  // namespace dlrun::launcher
