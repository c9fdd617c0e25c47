// The command-line layer every subcommand shares: value parsers and the parse loop.
#include "launcher/cli/flags.h"

#include <signal.h>

#include <string.h>

#include "common/signal_name.h"
#include "gtest/gtest.h"

namespace dlrun::cli {
namespace {

std::string Error(const absl::Status& s) { return std::string(s.message()); }

TEST(Flags, DurationsNodeRangesSignalsAndIntegersHaveOneErrorShape) {
  EXPECT_EQ(ParseDuration("grace-period", "1.5", true)->count(), 1500);
  EXPECT_EQ(ParseDuration("hang-timeout", "0", true)->count(), 0);
  EXPECT_EQ(Error(ParseDuration("join-timeout", "0", false).status()),
            "invalid value '0' for --join-timeout: expected seconds > 0 (e.g. 30, 1.5s, 500ms, 2m)");
  EXPECT_EQ(Error(ParseDuration("x", "-1", true).status()),
            "invalid value '-1' for --x: expected seconds >= 0 (e.g. 30, 1.5s, 500ms, 2m)");
  EXPECT_EQ(ParseDuration("duration", "10s", false)->count(), 10000);
  EXPECT_EQ(ParseDuration("duration", "250ms", false)->count(), 250);
  EXPECT_EQ(ParseDuration("duration", "2m", false)->count(), 120000);
  EXPECT_EQ(ParseDuration("duration", "1h", false)->count(), 3600000);
  for (const char* bad : {"s", "10x", "ms", "-2m", "2d"}) EXPECT_FALSE(ParseDuration("d", bad, true).ok()) << bad;
  EXPECT_FALSE(ParseDuration("x", "nan", true).ok());
  EXPECT_EQ(ParseNodeRange("nnodes", "2:4")->max, 4);
  EXPECT_EQ(ParseNodeRange("nnodes", "3")->min, 3);
  for (const char* bad : {"0", "4:2", "a", "1:2:3", ""}) {
    EXPECT_EQ(Error(ParseNodeRange("nnodes", bad).status()),
              std::string("invalid value '") + bad +
                  "' for --nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX");
  }
  EXPECT_EQ(*ParseSignalList("signals-to-handle", "SIGTERM,int,USR1"),
            (std::vector<int>{SIGTERM, SIGINT, SIGUSR1}));
  EXPECT_NE(Error(ParseSignalList("signals-to-handle", "SIGKILL").status())
                .find("invalid value 'SIGKILL' in --signals-to-handle"),
            std::string::npos);
  EXPECT_EQ(Error(ParseInt("port", "70000", 0, 65535).status()),
            "invalid value '70000' for --port: expected an integer from 0 to 65535");
}

// The names dlrun prints and parses are glibc's (sigabbrev_np, 2.32+, on the build machine),
// from a table of its own that the wheel's glibc 2.28 floor allows.
TEST(SignalAbbrev, NamesEverySignalAsGlibcDoes) {
  int named = 0;
  for (int s = 1; s < SIGRTMIN; ++s) {
    const char* glibc = sigabbrev_np(s);
    const char* ours = dlrun::SignalAbbrev(s);
    if (glibc == nullptr) {
      EXPECT_EQ(ours, nullptr) << s;
      continue;
    }
    ASSERT_NE(ours, nullptr) << s << " " << glibc;
    EXPECT_STREQ(ours, glibc) << s;
    ++named;
  }
  EXPECT_EQ(named, 31);
  EXPECT_EQ(dlrun::SignalAbbrev(SIGRTMIN + 1), nullptr);
  EXPECT_EQ(dlrun::SignalAbbrev(0), nullptr);
}

struct Opts {
  int n = 0;
  bool b = false;
  std::string s;
};

std::vector<Flag<Opts>> Table() {
  return {{"num-things", "n", true, IntField("num-things", &Opts::n, 0, 9), "a number"},
          {"flag", "", false, BoolField(&Opts::b), "a switch"},
          {"name", "", true, StrField(&Opts::s), "a word"}};
}

TEST(Flags, SpellingsShortFlagsPetFallbackAndTheProgram) {
  Opts o;
  auto p = ParseFlags(ParseSpec{"t"}, Table(), {"--num_things=3", "--flag", "prog", "--name", "x"}, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(o.n, 3);
  EXPECT_TRUE(o.b);
  EXPECT_EQ(o.s, "");  // after the program's name: the program's own argument
  EXPECT_EQ(p->program, (std::vector<std::string>{"prog", "--name", "x"}));
  Opts o2;
  p = ParseFlags(ParseSpec{"t"}, Table(), {"-n7", "--", "-prog"}, o2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(o2.n, 7);
  EXPECT_EQ(p->program, std::vector<std::string>{"-prog"});
  Opts o3;
  EnvLookup env = [](std::string_view n) -> std::optional<std::string> {
    if (n == "PET_NAME") return "from-env";
    if (n == "PET_NUM_THINGS") return "2";
    return std::nullopt;
  };
  p = ParseFlags(ParseSpec{"t", true, true}, Table(), {"--num-things", "5", "prog"}, o3, &env);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(o3.n, 5);  // the command line wins
  EXPECT_EQ(o3.s, "from-env");
  EXPECT_EQ(p->given, (std::set<std::string>{"num-things", "name"}));
  Opts o4;
  EXPECT_EQ(Error(ParseFlags(ParseSpec{"t"}, Table(), {"--flag=1", "p"}, o4).status()),
            "flag --flag takes no value, got '1'");
  EXPECT_EQ(Error(ParseFlags(ParseSpec{"t"}, Table(), {"--name"}, o4).status()),
            "flag --name needs a value");
  EXPECT_EQ(Error(ParseFlags(ParseSpec{"t"}, Table(), {"--flag"}, o4).status()),
            "missing the program to run: usage is t [options] PROGRAM [ARGS...]");
  EXPECT_EQ(Error(ParseFlags(ParseSpec{"t", false}, Table(), {"x"}, o4).status()),
            "unexpected argument 'x' for t (see t --help)");
}

// One --help path: the parse loop stops at -h/--help before the program (the flags before it
// still checked), and every usage text lists it; after the program it is the program's.
TEST(Flags, HelpStopsTheParseBeforeTheProgramAndIsListedInEveryUsage) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"-h"}, {"--num-things", "3", "--help"}, {"-h", "--bogus"}}) {
    Opts o;
    auto p = ParseFlags(ParseSpec{"t"}, Table(), args, o);  // no program: no error either
    ASSERT_TRUE(p.ok()) << args[0] << ": " << p.status();
    EXPECT_TRUE(p->help) << args[0];
  }
  Opts o;
  auto p = ParseFlags(ParseSpec{"t"}, Table(), {"prog", "--help"}, o);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->help);
  EXPECT_EQ(p->program, (std::vector<std::string>{"prog", "--help"}));
  p = ParseFlags(ParseSpec{"t"}, Table(), {"--", "--help"}, o);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->help);
  EXPECT_EQ(Error(ParseFlags(ParseSpec{"t"}, Table(), {"--num-things", "x", "--help"}, o).status()),
            "invalid value 'x' for --num-things: expected an integer from 0 to 9");
  const std::string usage = Usage("usage: t\n", Table());
  EXPECT_NE(usage.find("\n  -h, --help                  this text\n"), std::string::npos) << usage;
  EXPECT_NE(usage.find("\n  -V, --version               dlrun's version\n"), std::string::npos);
  p = ParseFlags(ParseSpec{"t"}, Table(), {"-n", "2", "--version"}, o);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->version);
  EXPECT_EQ(o.n, 2);
}

// PROGRAM may be missing where the spec says so, or after a flag that does something else.
TEST(Flags, AProgramIsOptionalWhereTheSpecSaysSo) {
  Opts o;
  ParseSpec optional{"t env"};
  optional.program_optional = true;
  EXPECT_TRUE(ParseFlags(optional, Table(), {"--flag"}, o).ok());
  ParseSpec without{"t"};
  without.without_program = {"name"};
  EXPECT_TRUE(ParseFlags(without, Table(), {"--name", "x"}, o).ok());
  EXPECT_EQ(Error(ParseFlags(without, Table(), {"--flag"}, o).status()),
            "missing the program to run: usage is t [options] PROGRAM [ARGS...]");
}

}  // namespace
}  // namespace dlrun::cli
