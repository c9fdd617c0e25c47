#include "unet/config.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"

namespace dlrun::examples {
namespace {

// yaml-cpp keeps "<<" as an ordinary key: apply merges ourselves (the merged map first, the
// node's own keys over it).
void Flatten(const YAML::Node& node, const std::string& prefix,
             std::map<std::string, std::string>* out) {
  if (node["<<"]) Flatten(node["<<"], prefix, out);
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (key == "<<") continue;
    const std::string full = prefix.empty() ? key : absl::StrCat(prefix, ".", key);
    if (kv.second.IsMap()) {
      Flatten(kv.second, full, out);
    } else if (kv.second.IsScalar()) {
      (*out)[full] = kv.second.as<std::string>();
    } else if (kv.second.IsNull()) {
      (*out)[full] = "";
    }
  }
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> LoadConfig(const std::string& path,
                                                              const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(absl::StrCat("cannot read the config file '", path,
                                            "' (--yaml-config): expected a YAML file"));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, " is not valid YAML: ", e.what()));
  }
  if (!root.IsMap() || !root[name] || !root[name].IsMap()) {
    std::string names;
    if (root.IsMap()) {
      for (const auto& kv : root) absl::StrAppend(&names, names.empty() ? "" : ", ", kv.first.as<std::string>());
    }
    return absl::InvalidArgumentError(absl::StrCat("no configuration '", name, "' in ", path,
                                                   ": expected one of ", names));
  }
  std::map<std::string, std::string> out;
  Flatten(root[name], "", &out);
  return out;
}

}  // namespace dlrun::examples
