// The one command-line layer of every dlrun subcommand (`dlrun`, `env`, `slurm`, `runai`,
// `rdzv-server`): a table of flags, one parse loop, one usage printer, and one parser per kind
// of value (integer, duration, node range, signal list), so the same mistake gets the same
// one-line error everywhere: "invalid value 'V' for --FLAG: expected WHAT".
//
// The rules are torchrun's: `--flag value` or `--flag=value`, '-' or '_' between words, short
// flags (`-m`, `-r3`), and "--" or the first word that is not a flag starts PROGRAM ARGS.
// CLI11 was considered: torchrun's PET_<FLAG> fallback for every flag, `-r3`-style short values
// and stopping at the program's first word are all custom there too, and the errors would have
// two formats; one small loop serves all five subcommands instead.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/defaults.h"
#include "common/env.h"  // EnvLookup
#include "launcher/base/bad_value.h"

namespace dlrun::cli {

using launcher::BadValue;  // launcher/base/bad_value.h

// Value parsers: `flag` names the flag in the error (without dashes).
absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& value, int lo, int hi);
// Seconds as a decimal ("1.5"); `allow_zero` accepts 0 (meaning "off" for some flags).
absl::StatusOr<std::chrono::milliseconds> ParseDuration(const std::string& flag,
                                                        const std::string& value, bool allow_zero);
struct NodeRange {
  int min = 1;
  int max = 1;
};
// "N" or "MIN:MAX" with 1 <= MIN <= MAX.
absl::StatusOr<NodeRange> ParseNodeRange(const std::string& flag, const std::string& value);
// "SIGTERM,INT,..." -> signal numbers; SIGKILL, SIGSTOP and SIGCHLD cannot be handled.
absl::StatusOr<std::vector<int>> ParseSignalList(const std::string& flag, const std::string& value);
// "KEY=VALUE,..." -> pairs in order; an item without '=' is an error naming it.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseKeyValues(
    const std::string& flag, const std::string& value);

template <typename Opts>
using Setter = std::function<absl::Status(Opts&, const std::string&)>;

template <typename Opts>
struct Flag {
  std::string name;        // canonical, '-' separated, without dashes ("nproc-per-node")
  std::string short_name;  // "m", "r", "o", or empty
  bool takes_value = true;
  Setter<Opts> set;
  std::string help;
};

struct ParseSpec {
  std::string command;           // "dlrun", "dlrun slurm", ...: named in errors
  bool wants_program = true;     // PROGRAM ARGS follow the flags (required)
  bool pet_fallback = false;     // a flag not given falls back to PET_<FLAG> (torchrun)
  bool program_optional = false;  // PROGRAM ARGS may follow, or not (`dlrun env`)
  // Flags that do something else than run PROGRAM, which may then be missing
  // (--print-completion).
  std::set<std::string> without_program = {};
};

struct Parsed {
  std::vector<std::string> program;  // PROGRAM ARGS
  std::set<std::string> given;       // canonical names set on the command line or by PET_*
  // -h or --help came before PROGRAM: the parse stopped there (the flags before it were
  // checked), and the caller prints its usage (Usage(), which lists it) and exits 0
  // (app/commands.h, Print).
  bool help = false;
  // -V or --version, likewise: the caller prints VersionText().
  bool version = false;
};

// What every subcommand's options start with (LaunchOptions, SlurmJobOptions, ...), filled by
// ParseCommand: PROGRAM ARGS, and -h/--help or -V/--version, after which nothing else is set and
// the caller prints its usage or VersionText() and exits 0.
struct CommandLine {
  std::vector<std::string> command;
  bool help = false;
  bool version = false;
};

// Parses `args` (after the subcommand) into `o`. Implemented over a type-erased table.
namespace internal {
struct ErasedFlag {
  std::string name, short_name;
  bool takes_value;
  std::function<absl::Status(const std::string&)> set;
};
absl::StatusOr<Parsed> Parse(const ParseSpec& spec, const std::vector<ErasedFlag>& flags,
                             const std::vector<std::string>& args, const EnvLookup* env);
std::string Usage(const std::string& head,
                  const std::vector<std::pair<std::string, std::string>>& lines);
}  // namespace internal

template <typename Opts>
absl::StatusOr<Parsed> ParseFlags(const ParseSpec& spec, const std::vector<Flag<Opts>>& flags,
                                  const std::vector<std::string>& args, Opts& o,
                                  const EnvLookup* env = nullptr) {
  std::vector<internal::ErasedFlag> erased;
  for (const Flag<Opts>& f : flags) {
    erased.push_back({f.name, f.short_name, f.takes_value,
                      [&o, set = f.set](const std::string& v) { return set(o, v); }});
  }
  return internal::Parse(spec, erased, args, env);
}

// The one parse preamble of every subcommand: ParseFlags into `o`, then the CommandLine part.
// Returns the names given (for the PET_* and the detection's "the command line wins").
template <typename Opts>
absl::StatusOr<std::set<std::string>> ParseCommand(const ParseSpec& spec,
                                                   const std::vector<Flag<Opts>>& flags,
                                                   const std::vector<std::string>& args, Opts& o,
                                                   const EnvLookup* env = nullptr) {
  static_assert(std::is_base_of_v<CommandLine, Opts>, "options start with cli::CommandLine");
  auto parsed = ParseFlags(spec, flags, args, o, env);
  if (!parsed.ok()) return parsed.status();
  o.help = parsed->help;
  o.version = parsed->version;
  if (!o.help && !o.version) o.command = std::move(parsed->program);
  return std::move(parsed->given);
}

// "dlrun VERSION (torchrun-compatible launcher)\n".
std::string VersionText();

// `head`, then a line per flag, then -h/--help and -V/--version, which every subcommand takes
// (Parsed::help, Parsed::version).
template <typename Opts>
std::string Usage(const std::string& head, const std::vector<Flag<Opts>>& flags) {
  std::vector<std::pair<std::string, std::string>> lines;
  for (const Flag<Opts>& f : flags) {
    std::string lhs = (f.name.size() == 1 ? "-" : "--") + f.name;
    if (!f.short_name.empty()) lhs = "-" + f.short_name + ", " + lhs;
    if (f.takes_value) lhs += " VALUE";
    lines.emplace_back(lhs, f.help);
  }
  lines.emplace_back("-h, --help", "this text");
  lines.emplace_back("-V, --version", "dlrun's version");
  return internal::Usage(head, lines);
}

// Setters for the common field kinds.
template <typename Opts>
Setter<Opts> StrField(std::string Opts::*field) {
  return [field](Opts& o, const std::string& v) {
    o.*field = v;
    return absl::OkStatus();
  };
}
template <typename Opts>
Setter<Opts> BoolField(bool Opts::*field) {
  return [field](Opts& o, const std::string&) {
    o.*field = true;
    return absl::OkStatus();
  };
}
template <typename Opts>
Setter<Opts> IntField(const std::string& flag, int Opts::*field, int lo, int hi) {
  return [=](Opts& o, const std::string& v) {
    auto n = ParseInt(flag, v, lo, hi);
    if (!n.ok()) return n.status();
    o.*field = *n;
    return absl::OkStatus();
  };
}
template <typename Opts>
Setter<Opts> DurationField(const std::string& flag, std::chrono::milliseconds Opts::*field,
                           bool allow_zero) {
  return [=](Opts& o, const std::string& v) {
    auto d = ParseDuration(flag, v, allow_zero);
    if (!d.ok()) return d.status();
    o.*field = *d;
    return absl::OkStatus();
  };
}
// A finite number in [lo, hi].
absl::StatusOr<double> ParseDouble(const std::string& flag, const std::string& v, double lo,
                                   double hi);
template <typename Opts>
Setter<Opts> DoubleField(const std::string& flag, double Opts::*field, double lo, double hi) {
  return [=](Opts& o, const std::string& v) {
    auto d = ParseDouble(flag, v, lo, hi);
    if (!d.ok()) return d.status();
    o.*field = *d;
    return absl::OkStatus();
  };
}
// The telemetry flags dlrun and `dlrun rdzv-server` share (docs/TELEMETRY.md).
struct TelemetryFlags {
  int metrics_port = defaults::kMetricsPortOff;
  std::string metrics_addr = defaults::kMetricsAddr;
  double straggler_factor = defaults::kStragglerFactor;
  int straggler_windows = defaults::kStragglerWindows;
};
template <typename Opts>
void AddTelemetryFlags(TelemetryFlags Opts::*field, std::vector<Flag<Opts>>* flags) {
  flags->push_back({"metrics-port", "", true,
                    [=](Opts& o, const std::string& v) {
                      auto n = ParseInt("metrics-port", v, 0, 65535);
                      if (!n.ok()) return n.status();
                      (o.*field).metrics_port = *n;
                      return absl::OkStatus();
                    },
                    "serve the job's telemetry over HTTP on this port (0: any free one): "
                    "/metrics (Prometheus), /api/job (JSON), / (a live page). Off by default"});
  flags->push_back({"metrics-addr", "", true,
                    [=](Opts& o, const std::string& v) {
                      (o.*field).metrics_addr = v;
                      return absl::OkStatus();
                    },
                    absl::StrCat("address --metrics-port binds (default ", defaults::kMetricsAddr,
                                 ", every interface)")});
  flags->push_back({"straggler-factor", "", true,
                    [=](Opts& o, const std::string& v) {
                      auto d = ParseDouble("straggler-factor", v, 1.01, 100);
                      if (!d.ok()) return d.status();
                      (o.*field).straggler_factor = *d;
                      return absl::OkStatus();
                    },
                    absl::StrCat("a rank whose compute per step stays above the job's median "
                                 "by this factor is named a straggler (default ",
                                 defaults::kStragglerFactor, ")")});
  flags->push_back({"straggler-windows", "", true,
                    [=](Opts& o, const std::string& v) {
                      auto n = ParseInt("straggler-windows", v, 1, 1000);
                      if (!n.ok()) return n.status();
                      (o.*field).straggler_windows = *n;
                      return absl::OkStatus();
                    },
                    absl::StrCat("for this many consecutive ",
                                 defaults::kTelemetryWindow.count() / 1000.0,
                                 "-s windows (default ", defaults::kStragglerWindows, ")")});
}

template <typename Opts>
Setter<Opts> NodeRangeField(const std::string& flag, NodeRange Opts::*field) {
  return [=](Opts& o, const std::string& v) {
    auto r = ParseNodeRange(flag, v);
    if (!r.ok()) return r.status();
    o.*field = *r;
    return absl::OkStatus();
  };
}

// A value that goes into an #SBATCH line or a YAML scalar (dlrun slurm, dlrun runai):
// printable, no spaces, quotes, '#', '$' or backslash.
absl::Status PlainWord(const std::string& flag, const std::string& v);

template <typename Opts>
Setter<Opts> WordField(const std::string& flag, std::string Opts::*field) {
  return [=](Opts& o, const std::string& v) {
    if (absl::Status s = PlainWord(flag, v); !s.ok()) return s;
    o.*field = v;
    return absl::OkStatus();
  };
}

}  // namespace dlrun::cli
