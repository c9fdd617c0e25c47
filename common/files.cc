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

}  // namespace dlrun
