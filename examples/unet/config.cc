#include "unet/config.h"

#ifndef DLRUN_UNET_NO_YAML
#include <yaml-cpp/yaml.h>
#endif

#include <filesystem>
#include <fstream>
#include <iterator>

#include "worker/src/text.h"

namespace dlrun::examples {

#ifndef DLRUN_UNET_NO_YAML
namespace {

// yaml-cpp keeps "<<" as an ordinary key: apply merges ourselves (the merged maps first, the
// node's own keys over them). Nodes are visited by value, so an alias cycle would recurse
// forever: `depth` bounds it.
lite::Status Flatten(const YAML::Node& node, const std::string& prefix, int depth,
                     std::map<std::string, std::string>* out) {
  const std::string where =
      prefix.empty() ? "the configuration" : lite::StrCat("'", lite::CEscape(prefix), "'");
  if (depth > kMaxConfigDepth) {
    return lite::InvalidArgumentError(lite::StrCat(where, " nests deeper than ", kMaxConfigDepth,
                                                   " levels (a merge of an anchor into itself?)"));
  }
  if (const YAML::Node merge = node["<<"]) {
    if (merge.IsMap()) {
      if (lite::Status s = Flatten(merge, prefix, depth + 1, out); !s.ok()) return s;
    } else if (merge.IsSequence()) {
      // Earlier maps win: apply the list back to front.
      for (std::size_t i = merge.size(); i-- > 0;) {
        if (!merge[i].IsMap()) {
          return lite::InvalidArgumentError(
              lite::StrCat("merge key '<<' of ", where, ": expected a map or a list of maps"));
        }
        if (lite::Status s = Flatten(merge[i], prefix, depth + 1, out); !s.ok()) return s;
      }
    } else {
      return lite::InvalidArgumentError(
          lite::StrCat("merge key '<<' of ", where, ": expected a map or a list of maps"));
    }
  }
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) {
      return lite::InvalidArgumentError(
          lite::StrCat("a key of ", where, " is not a scalar: expected a name"));
    }
    const std::string key = kv.first.Scalar();
    if (key == "<<") continue;
    const std::string full = prefix.empty() ? key : lite::StrCat(prefix, ".", key);
    if (kv.second.IsMap()) {
      if (lite::Status s = Flatten(kv.second, full, depth + 1, out); !s.ok()) return s;
    } else if (kv.second.IsScalar()) {
      (*out)[full] = kv.second.Scalar();
    } else if (kv.second.IsNull()) {
      (*out)[full] = "";
    }
  }
  return lite::OkStatus();
}

}  // namespace

lite::StatusOr<std::map<std::string, std::string>> ParseConfig(const std::string& yaml,
                                                               const std::string& name,
                                                               const std::string& source) {
  try {
    const YAML::Node root = YAML::Load(yaml);
    if (!root.IsMap() || !root[name] || !root[name].IsMap()) {
      std::string names;
      if (root.IsMap()) {
        for (const auto& kv : root) {
          if (kv.first.IsScalar())
            lite::StrAppend(&names, names.empty() ? "" : ", ", lite::CEscape(kv.first.Scalar()));
        }
      }
      return lite::InvalidArgumentError(lite::StrCat("no configuration '", lite::CEscape(name),
                                                     "' in ", source, ": expected one of ",
                                                     names.empty() ? "(none)" : names));
    }
    std::map<std::string, std::string> out;
    if (lite::Status s = Flatten(root[name], "", 0, &out); !s.ok()) {
      return lite::InvalidArgumentError(
          lite::StrCat("configuration '", lite::CEscape(name), "' in ", source, ": ", s.message()));
    }
    return out;
  } catch (const YAML::Exception& e) {
    return lite::InvalidArgumentError(
        lite::StrCat("config file ", source, " is not valid YAML: ", e.what()));
  }
}
#else
// Built without yaml-cpp (a build from the wheel where its CMake package is not found).
lite::StatusOr<std::map<std::string, std::string>> ParseConfig(const std::string&,
                                                               const std::string& name,
                                                               const std::string& source) {
  return lite::FailedPreconditionError(lite::StrCat(
      "configuration '", lite::CEscape(name), "' in ", source,
      ": this train_unet was built without yaml-cpp, so it reads no YAML; give the settings as "
      "flags, or rebuild where find_package(yaml-cpp) succeeds"));
}
#endif

lite::StatusOr<std::map<std::string, std::string>> LoadConfig(const std::string& path,
                                                              const std::string& name) {
  const auto unreadable = [&] {
    return lite::NotFoundError(lite::StrCat("cannot read the config file '", path,
                                            "' (--yaml-config): expected a YAML file"));
  };
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return lite::NotFoundError(lite::StrCat("config file '", path, "' (--yaml-config) not found"));
  }
  if (std::filesystem::is_directory(path, ec)) return unreadable();
  std::ifstream in(path, std::ios::binary);
  if (!in) return unreadable();
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {  // libstdc++ throws on a read error (EIO, EISDIR)
    return unreadable();
  }
  if (in.bad()) return unreadable();
  return ParseConfig(text, name, path);
}

std::string DefaultConfigFile(const std::string& exe) {
  const size_t slash = exe.rfind('/');
  if (slash != std::string::npos) {
    const std::filesystem::path p = std::filesystem::path(exe.substr(0, slash)) / ".." / "share" /
                                    "dlrun" / "unet" / "UNet.yaml";
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.lexically_normal().string();
  }
  return "examples/unet/config/UNet.yaml";
}

}  // namespace dlrun::examples
