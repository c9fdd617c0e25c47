// Folding, drawing and reading sampled stacks (flamegraph.h).
#include "launcher/profile/flamegraph.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dlrun::launcher {
namespace {

// One call-chain line of `perf script`: "\t    7f12 sym+0x1c (/lib/x.so)" -> "sym" (or
// "[x.so]" without a symbol); kernel frames get "_[k]".
std::string PerfFrame(absl::string_view line) {
  line = absl::StripAsciiWhitespace(line);
  const size_t sp = line.find(' ');
  if (sp == absl::string_view::npos) return "[unknown]";
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(sp + 1));
  absl::string_view module;
  if (absl::EndsWith(rest, ")")) {
    const size_t open = rest.rfind(" (");
    if (open != absl::string_view::npos) {
      module = rest.substr(open + 2, rest.size() - open - 3);
      rest = rest.substr(0, open);
    }
  }
  const size_t plus = rest.rfind("+0x");
  if (plus != absl::string_view::npos) rest = rest.substr(0, plus);
  std::string name(rest);
  if (name.empty() || name == "[unknown]") {
    const size_t slash = module.rfind('/');
    absl::string_view base = slash == absl::string_view::npos ? module : module.substr(slash + 1);
    name = base.empty() || base == "[unknown]" ? "[unknown]" : absl::StrCat("[", base, "]");
  }
  if (module == "[kernel.kallsyms]") absl::StrAppend(&name, "_[k]");
  // ';' separates frames in the folded format (C++ names have none, but be sure).
  std::replace(name.begin(), name.end(), ';', ':');
  return name;
}

// "f (file.py:12)" -> "f (file.py)": a Python function's lines count together.
std::string WithoutLine(absl::string_view frame) {
  if (!absl::EndsWith(frame, ")")) return std::string(frame);
  const size_t colon = frame.rfind(':');
  const size_t open = frame.rfind(" (");
  if (colon == absl::string_view::npos || open == absl::string_view::npos || colon < open) {
    return std::string(frame);
  }
  absl::string_view digits = frame.substr(colon + 1, frame.size() - colon - 2);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return std::string(frame);
  }
  return absl::StrCat(frame.substr(0, colon), ")");
}

bool Unnamed(absl::string_view frame) {
  return frame.empty() || frame.front() == '[';
}

struct Node {
  std::string name;
  int64_t total = 0;
  std::vector<std::unique_ptr<Node>> children;
  Node* Child(absl::string_view n) {
    for (auto& c : children) {
      if (c->name == n) return c.get();
    }
    children.push_back(std::make_unique<Node>());
    children.back()->name = std::string(n);
    return children.back().get();
  }
};

std::string Escape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// FlameGraph's warm palette, fixed per name so a frame keeps its colour across ranks.
std::string Colour(absl::string_view name) {
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  const int r = 205 + static_cast<int>(h % 50);
  const int g = static_cast<int>((h >> 8) % 180);
  const int b = static_cast<int>((h >> 16) % 55);
  return absl::StrFormat("rgb(%d,%d,%d)", r, g, b);
}

constexpr double kWidth = 1200, kFrameHeight = 16, kPad = 10, kTitleHeight = 40;

void Draw(const Node& n, int depth, double x, double px_per_sample, int64_t all, double height,
          std::string* svg) {
  const double w = static_cast<double>(n.total) * px_per_sample;
  if (w < 0.1) return;
  const double y = height - kPad - (depth + 1) * kFrameHeight;
  const double pct = 100.0 * static_cast<double>(n.total) / static_cast<double>(all);
  absl::StrAppendFormat(svg,
                        "<g><title>%s (%d samples, %.2f%%)</title><rect x=\"%.1f\" y=\"%.1f\" "
                        "width=\"%.1f\" height=\"%.1f\" fill=\"%s\" rx=\"2\"/>",
                        Escape(n.name), n.total, pct, x, y, w, kFrameHeight - 1, Colour(n.name));
  const size_t fits = static_cast<size_t>(std::max(0.0, (w - 6) / 7));
  if (fits >= 3) {
    std::string label = n.name.size() <= fits ? n.name : n.name.substr(0, fits - 2) + "..";
    absl::StrAppendFormat(svg, "<text x=\"%.1f\" y=\"%.1f\">%s</text>", x + 3,
                          y + kFrameHeight - 4, Escape(label));
  }
  absl::StrAppend(svg, "</g>\n");
  double cx = x;
  for (const auto& c : n.children) {
    Draw(*c, depth + 1, cx, px_per_sample, all, height, svg);
    cx += static_cast<double>(c->total) * px_per_sample;
  }
}

int Depth(const Node& n) {
  int d = 0;
  for (const auto& c : n.children) d = std::max(d, Depth(*c));
  return d + 1;
}

}  // namespace

Folded FoldPerfScript(const std::string& text) {
  Folded out;
  std::string comm;
  std::vector<std::string> frames;  // innermost first
  bool in_sample = false;
  auto flush = [&] {
    if (in_sample && !frames.empty()) {
      std::string stack = comm;
      for (auto it = frames.rbegin(); it != frames.rend(); ++it) absl::StrAppend(&stack, ";", *it);
      ++out[stack];
    }
    frames.clear();
    in_sample = false;
  };
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StripAsciiWhitespace(line).empty()) {
      flush();
    } else if (line.front() == '\t' || line.front() == ' ') {
      if (in_sample) frames.push_back(PerfFrame(line));
    } else {
      flush();
      // "comm  pid[/tid] [cpu] time: period event:": the command may hold blanks and digits;
      // the pid is the word before the time (and the CPU, when shown).
      std::vector<absl::string_view> words =
          absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      size_t time_at = 0;
      double t = 0;
      while (time_at < words.size() &&
             !(absl::EndsWith(words[time_at], ":") &&
               absl::SimpleAtod(words[time_at].substr(0, words[time_at].size() - 1), &t))) {
        ++time_at;
      }
      size_t pid_at = time_at > 0 ? time_at - 1 : 0;
      if (pid_at > 0 && absl::StartsWith(words[pid_at], "[")) --pid_at;
      comm = pid_at == 0 ? std::string(words.empty() ? "?" : words[0])
                         : absl::StrJoin(words.begin(), words.begin() + pid_at, " ");
      std::replace(comm.begin(), comm.end(), ';', ':');
      in_sample = true;
    }
  }
  flush();
  return out;
}

absl::StatusOr<Folded> ParseFolded(const std::string& text) {
  Folded out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    line = absl::StripTrailingAsciiWhitespace(line);
    const size_t sp = line.rfind(' ');
    int64_t n = 0;
    if (sp == absl::string_view::npos || !absl::SimpleAtoi(line.substr(sp + 1), &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid folded-stack line '", line.substr(0, 120), "': expected 'frame;frame COUNT'"));
    }
    // py-spy's samples of a thread outside Python code have no frames.
    absl::string_view stack = absl::StripAsciiWhitespace(line.substr(0, sp));
    out[stack.empty() ? std::string("[unknown]") : std::string(stack)] += n;
  }
  return out;
}

std::string FoldedText(const Folded& f) {
  std::string out;
  for (const auto& [stack, n] : f) absl::StrAppend(&out, stack, " ", n, "\n");
  return out;
}

int64_t TotalSamples(const Folded& f) {
  int64_t n = 0;
  for (const auto& [stack, c] : f) n += c;
  return n;
}

std::string FlameGraphSvg(const Folded& f, const std::string& title) {
  Node root;
  root.name = "all";
  for (const auto& [stack, n] : f) {
    root.total += n;
    Node* at = &root;
    for (absl::string_view frame : absl::StrSplit(stack, ';')) {
      at = at->Child(frame);
      at->total += n;
    }
  }
  const int depth = Depth(root);
  const double height = kTitleHeight + depth * kFrameHeight + 2 * kPad;
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" standalone=\"no\"?>\n"
      "<svg version=\"1.1\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "xmlns=\"http://www.w3.org/2000/svg\">\n"
      "<style>text{font-family:monospace;font-size:12px;fill:#000}"
      "g:hover rect{stroke:#000;stroke-width:0.5}</style>\n"
      "<rect x=\"0\" y=\"0\" width=\"100%%\" height=\"100%%\" fill=\"#f8f8f8\"/>\n"
      "<text x=\"%.0f\" y=\"24\" style=\"font-size:17px\">%s (%d samples)</text>\n",
      kWidth, height, kWidth, height, kPad, Escape(title), root.total);
  if (root.total > 0) {
    Draw(root, 0, kPad, (kWidth - 2 * kPad) / static_cast<double>(root.total), root.total, height,
         &svg);
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

std::vector<HotFrame> HotFrames(const Folded& f, size_t n) {
  std::map<std::string, int64_t> self;
  int64_t all = 0;
  for (const auto& [stack, c] : f) {
    all += c;
    std::vector<absl::string_view> frames = absl::StrSplit(stack, ';');
    // The innermost named frame below the root (the command); none: not ranked.
    auto it = std::find_if(frames.rbegin(), frames.rend() - 1,
                           [](absl::string_view fr) { return !Unnamed(fr); });
    if (it != frames.rend() - 1) self[WithoutLine(*it)] += c;
  }
  std::vector<HotFrame> out;
  if (all == 0) return out;
  for (const auto& [frame, c] : self) {
    out.push_back({frame, static_cast<double>(c) / static_cast<double>(all)});
  }
  std::sort(out.begin(), out.end(), [](const HotFrame& a, const HotFrame& b) {
    return a.fraction != b.fraction ? a.fraction > b.fraction : a.frame < b.frame;
  });
  if (out.size() > n) out.resize(n);
  return out;
}

std::string ShortCxxName(const std::string& name) {
  absl::string_view n = name;
  // std::function's call of a lambda: the lambda is the second template argument.
  constexpr absl::string_view kHandler = "std::_Function_handler<";
  std::string inner;
  if (absl::StartsWith(n, kHandler)) {
    int depth = 0;
    size_t from = std::string::npos, to = std::string::npos;
    for (size_t i = kHandler.size(); i < n.size(); ++i) {
      const char c = n[i];
      if (c == '<' || c == '(' || c == '{') ++depth;
      if (c == '>' || c == ')' || c == '}') {
        if (depth == 0) {
          to = i;
          break;
        }
        --depth;
      }
      if (c == ',' && depth == 0 && from == std::string::npos) from = i + 1;
    }
    if (from != std::string::npos && to != std::string::npos) {
      inner = std::string(absl::StripAsciiWhitespace(n.substr(from, to - from)));
      n = inner;
    }
  }
  // Template arguments and parameter lists out; a lambda stays "{lambda}".
  std::string out;
  int depth = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    if (absl::StartsWith(n.substr(i), "operator") && depth == 0) {
      // operator(), operator<, operator<<: kept as written up to the parameter list
      const size_t end = n.find('(', i + 9);
      out += std::string(n.substr(i, (end == absl::string_view::npos ? n.size() : end) - i));
      i = end == absl::string_view::npos ? n.size() : end - 1;
      continue;
    }
    if (c == '{' && depth == 0 && absl::StartsWith(n.substr(i), "{lambda")) {
      const size_t close = n.find('}', i);
      out += "{lambda}";
      if (close == absl::string_view::npos) break;
      i = close;
      continue;
    }
    if (c == '<' || c == '(') ++depth;
    if (depth == 0) out += c;
    if ((c == '>' || c == ')') && depth > 0) --depth;
  }
  out = absl::StrReplaceAll(out, {{"::::", "::"}, {" const", ""}});
  return std::string(absl::StripAsciiWhitespace(out)).empty() ? name : out;
}

std::string HotFramesText(const std::vector<HotFrame>& hot) {
  std::vector<std::string> parts;
  for (const HotFrame& h : hot) {
    parts.push_back(absl::StrFormat("%.0f%% in %s", 100 * h.fraction, h.frame));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace dlrun::launcher
