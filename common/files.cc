#include "common/files.h"

#include <fstream>
#include <sstream>

namespace dlrun {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> CgroupAncestry(std::string path) {
  std::vector<std::string> out;
  while (!path.empty()) {
    out.push_back(path);
    if (path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return out;
}

bool CgroupEntry::Has(const std::string& controller) const {
  for (const std::string& c : controllers) {
    if (c == controller) return true;
  }
  return false;
}

std::vector<CgroupEntry> ParseProcCgroup(const std::string& text) {
  std::vector<CgroupEntry> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    CgroupEntry e;
    std::istringstream list(line.substr(a + 1, b - a - 1));
    for (std::string c; std::getline(list, c, ',');) {
      if (!c.empty()) e.controllers.push_back(c);
    }
    e.path = line.substr(b + 1);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace dlrun
