#include "launcher/cli/flags.h"

#include <algorithm>
#include <cmath>

#include <signal.h>
#include <string.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/signal_name.h"

namespace dlrun::cli {

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& value, int lo, int hi) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    std::string expected = absl::StrCat("an integer from ", lo, " to ", hi);
    if (hi == std::numeric_limits<int>::max()) expected = absl::StrCat("an integer >= ", lo);
    return BadValue(flag, value, expected);
  }
  return v;
}

absl::StatusOr<std::chrono::milliseconds> ParseDuration(const std::string& flag,
                                                        const std::string& value,
                                                        bool allow_zero) {
  // Seconds, with an optional unit: 90, 1.5s, 500ms, 2m, 1h.
  absl::string_view number = value;
  double unit = 1;
  if (absl::ConsumeSuffix(&number, "ms")) {
    unit = 0.001;
  } else if (absl::ConsumeSuffix(&number, "s")) {
  } else if (absl::ConsumeSuffix(&number, "m")) {
    unit = 60;
  } else if (absl::ConsumeSuffix(&number, "h")) {
    unit = 3600;
  }
  double secs = 0;
  if (!absl::SimpleAtod(number, &secs) || !(secs >= 0) || secs * unit > 1e9 ||
      (!allow_zero && secs == 0)) {
    return BadValue(flag, value, allow_zero ? "seconds >= 0 (e.g. 30, 1.5s, 500ms, 2m)"
                                            : "seconds > 0 (e.g. 30, 1.5s, 500ms, 2m)");
  }
  secs *= unit;
  return std::chrono::milliseconds(static_cast<int64_t>(secs * 1000 + 0.5));
}

absl::StatusOr<NodeRange> ParseNodeRange(const std::string& flag, const std::string& value) {
  const std::string expected = "N or MIN:MAX with 1 <= MIN <= MAX";
  std::vector<std::string> parts = absl::StrSplit(value, ':');
  NodeRange r;
  if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &r.min)) {
    r.max = r.min;
  } else if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.min) ||
             !absl::SimpleAtoi(parts[1], &r.max)) {
    return BadValue(flag, value, expected);
  }
  if (r.min < 1 || r.max < r.min) return BadValue(flag, value, expected);
  return r;
}

absl::StatusOr<std::vector<int>> ParseSignalList(const std::string& flag,
                                                 const std::string& value) {
  std::vector<int> out;
  for (absl::string_view name : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    std::string n = absl::AsciiStrToUpper(name);
    if (absl::StartsWith(n, "SIG")) n = n.substr(3);
    int sig = 0;
    for (int s = 1; s < NSIG; ++s) {
      const char* abbrev = dlrun::SignalAbbrev(s);
      if (abbrev != nullptr && n == abbrev) sig = s;
    }
    if (sig == 0 || sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid value '", name, "' in --", flag,
          ": expected signal names such as SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"));
    }
    out.push_back(sig);
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseKeyValues(
    const std::string& flag, const std::string& value) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid item '", item, "' in --", flag, ": expected KEY=VALUE"));
    }
    out.emplace_back(kv[0], kv[1]);
  }
  return out;
}

namespace internal {
namespace {

std::string Normalize(const std::string& name) {
  return absl::StrReplaceAll(absl::AsciiStrToLower(name), {{"_", "-"}});
}

// Splits one argument into a flag name and an inline value: "--a-b=v", "--a_b", "-m", "-r3".
void SplitArg(const std::string& a, std::string* name, std::optional<std::string>* value) {
  if (a[1] == '-') {
    std::string body = a.substr(2);
    if (size_t eq = body.find('='); eq != std::string::npos) {
      *value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    *name = Normalize(body);
    return;
  }
  *name = a.substr(1);
  if (size_t eq = name->find('='); eq != std::string::npos) {  // "-o=FILE"
    *value = name->substr(eq + 1);
    *name = name->substr(0, eq);
  } else if (name->size() > 1) {  // "-r3": a short flag with its value attached
    *value = name->substr(1);
    *name = name->substr(0, 1);
  }
}

const ErasedFlag* Find(const std::vector<ErasedFlag>& flags, const std::string& name) {
  for (const ErasedFlag& f : flags) {
    if (f.name == name || (!f.short_name.empty() && f.short_name == name)) return &f;
  }
  return nullptr;
}

// Edit distance (insertions, deletions, substitutions), for "did you mean".
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// A long flag not spelled out: its unambiguous prefix (as argparse, and so torchrun, accepts),
// else an error that names the candidates or the nearest flag.
absl::StatusOr<const ErasedFlag*> FindLong(const ParseSpec& spec,
                                           const std::vector<ErasedFlag>& flags,
                                           const std::string& name, const std::string& arg) {
  if (const ErasedFlag* f = Find(flags, name); f != nullptr) return f;
  std::vector<const ErasedFlag*> prefixed;
  for (const ErasedFlag& f : flags) {
    if (f.name.size() > 1 && f.name.rfind(name, 0) == 0) prefixed.push_back(&f);
  }
  if (prefixed.size() == 1 && !name.empty()) return prefixed[0];
  const std::string see = absl::StrCat(" (see ", spec.command, " --help)");
  if (prefixed.size() > 1 && !name.empty()) {
    std::vector<std::string> names;
    for (const ErasedFlag* f : prefixed) names.push_back("--" + f->name);
    return absl::InvalidArgumentError(absl::StrCat("ambiguous flag '", arg, "' for ", spec.command,
                                                   ": it could be ", absl::StrJoin(names, ", "),
                                                   see));
  }
  const ErasedFlag* nearest = nullptr;
  size_t best = std::max<size_t>(2, name.size() / 4) + 1;
  for (const ErasedFlag& f : flags) {
    if (f.name.size() <= 1) continue;
    const size_t d = Distance(name, f.name);
    if (d < best) {
      best = d;
      nearest = &f;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown flag '", arg, "' for ", spec.command,
      nearest != nullptr ? absl::StrCat(": did you mean --", nearest->name, "?") : "", see));
}

absl::Status PetFallbacks(const std::vector<ErasedFlag>& flags, const EnvLookup& env,
                          Parsed* out) {
  for (const ErasedFlag& f : flags) {
    if (out->given.count(f.name)) continue;
    const std::string var =
        absl::StrCat("PET_", absl::AsciiStrToUpper(absl::StrReplaceAll(f.name, {{"-", "_"}})));
    std::optional<std::string> v = env(var);
    if (!v.has_value()) continue;
    if (!f.takes_value) {
      const std::string lower = absl::AsciiStrToLower(*v);
      if (lower == "0" || lower == "false" || lower.empty()) continue;
    }
    if (absl::Status s = f.set(*v); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(s.message(), " (from ", var, ")"));
    }
    out->given.insert(f.name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Parsed> Parse(const ParseSpec& spec, const std::vector<ErasedFlag>& flags,
                             const std::vector<std::string>& args, const EnvLookup* env) {
  Parsed out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      out.help = true;
      return out;
    }
    if (a == "-V" || a == "--version") {
      out.version = true;
      return out;
    }
    if (a.size() < 2 || a[0] != '-') {
      if (!spec.wants_program) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "' for ",
                                                       spec.command, " (see ", spec.command,
                                                       " --help)"));
      }
      break;  // PROGRAM
    }
    std::string name;
    std::optional<std::string> value;
    SplitArg(a, &name, &value);
    const ErasedFlag* f = Find(flags, name);
    if (f == nullptr && a[1] == '-') {
      absl::StatusOr<const ErasedFlag*> found = FindLong(spec, flags, name, a);
      if (!found.ok()) return found.status();
      f = *found;
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", a, "' for ", spec.command,
                                                     " (see ", spec.command, " --help)"));
    }
    if (f->takes_value && !value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", f->name, " needs a value"));
      }
      value = args[++i];
    } else if (!f->takes_value && value) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", f->name, " takes no value, got '", *value, "'"));
    }
    if (absl::Status s = f->set(value.value_or("")); !s.ok()) return s;
    out.given.insert(f->name);
  }
  out.program.assign(args.begin() + static_cast<long>(i), args.end());
  if (spec.pet_fallback && env != nullptr) {
    if (absl::Status s = PetFallbacks(flags, *env, &out); !s.ok()) return s;
  }
  bool program_needed = spec.wants_program && !spec.program_optional;
  for (const std::string& f : spec.without_program) program_needed &= out.given.count(f) == 0;
  if (program_needed && out.program.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("missing the program to run: usage is ",
                                                   spec.command, " [options] PROGRAM [ARGS...]"));
  }
  if (!spec.wants_program && !out.program.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", out.program[0],
                                                   "' for ", spec.command));
  }
  return out;
}

std::string Usage(const std::string& head,
                  const std::vector<std::pair<std::string, std::string>>& lines) {
  std::string s = head;
  for (const auto& [lhs, help] : lines) {
    std::string left = "  " + lhs;
    left.resize(std::max<size_t>(left.size() + 1, 30), ' ');
    absl::StrAppend(&s, left, help, "\n");
  }
  return s;
}

}  // namespace internal

std::string VersionText() {
  return absl::StrCat("dlrun ", DLRUN_VERSION, " (torchrun-compatible launcher)\n");
}
absl::StatusOr<double> ParseDouble(const std::string& flag, const std::string& v, double lo,
                                   double hi) {
  double d = 0;
  if (!absl::SimpleAtod(v, &d) || !std::isfinite(d) || d < lo || d > hi) {
    return BadValue(flag, v, absl::StrCat("a number from ", lo, " to ", hi));
  }
  return d;
}

absl::Status PlainWord(const std::string& flag, const std::string& v) {
  if (v.empty()) return BadValue(flag, v, "a non-empty value");
  for (unsigned char c : v) {
    if (c <= ' ' || c >= 0x7f || c == '"' || c == '\'' || c == '\\' || c == '#' || c == '`' ||
        c == '$') {
      return BadValue(flag, v, "a single word without spaces, quotes, '#', '$' or '\\'");
    }
  }
  return absl::OkStatus();
}

}  // namespace dlrun::cli
