#include "launcher/base/bad_nodes.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

std::string Clean(std::string s) {  // one field: no tabs or line breaks
  for (char& c : s) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

absl::Status WriteList(FileSystem& fs, const std::string& path,
                       const std::vector<BadNode>& nodes) {
  std::string text;
  for (const BadNode& n : nodes) {
    absl::StrAppend(&text, Clean(n.host), "\t", n.since, "\t", Clean(n.reason), "\n");
  }
  return fs.Write(path, text, 0644);
}

}  // namespace

std::string BadNodesPath() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  if (cache != nullptr && *cache == '/') return absl::StrCat(cache, "/dlrun/bad_nodes.tsv");
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return absl::StrCat(home, "/.cache/dlrun/bad_nodes.tsv");
  return "";
}

std::vector<BadNode> ReadBadNodes(const FileSystem& fs, const std::string& path) {
  std::vector<BadNode> out;
  auto text = fs.Read(path, size_t{1} << 20);
  if (!text.ok()) return out;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits('\t', 2));
    BadNode n;
    if (f.size() != 3 || f[0].empty() || !absl::SimpleAtoi(f[1], &n.since)) continue;
    n.host = std::string(f[0]);
    n.reason = std::string(f[2]);
    out.push_back(std::move(n));
  }
  return out;
}

absl::Status AddBadNode(FileSystem& fs, const std::string& path, const BadNode& node) {
  std::vector<BadNode> nodes = ReadBadNodes(fs, path);
  bool found = false;
  for (BadNode& n : nodes) {
    if (n.host == node.host) {
      n = node;
      found = true;
    }
  }
  if (!found) nodes.push_back(node);
  return WriteList(fs, path, nodes);
}

void RecordBadNode(FileSystem& fs, const std::vector<std::string>& paths, const BadNode& node) {
  for (const std::string& path : paths) {
    if (path.empty()) continue;
    if (absl::Status s = AddBadNode(fs, path, node); !s.ok()) {
      spdlog::warn("cannot record {} as a bad node: {}", node.host, std::string(s.message()));
    }
  }
}

absl::StatusOr<int> ClearBadNodes(FileSystem& fs, const std::string& path,
                                  const std::vector<std::string>& hosts) {
  std::vector<BadNode> nodes = ReadBadNodes(fs, path);
  std::vector<BadNode> kept;
  for (BadNode& n : nodes) {
    const bool drop = hosts.empty() ||
                      std::find(hosts.begin(), hosts.end(), n.host) != hosts.end();
    if (!drop) kept.push_back(std::move(n));
  }
  const int removed = static_cast<int>(nodes.size() - kept.size());
  if (removed == 0) return 0;
  if (absl::Status s = WriteList(fs, path, kept); !s.ok()) return s;
  return removed;
}

std::string BadNodeHosts(const std::vector<BadNode>& nodes) {
  return absl::StrJoin(nodes, ",", [](std::string* out, const BadNode& n) { out->append(n.host); });
}

}  // namespace dlrun::launcher
