// One registry for every pluggable kind (codecs, GPU codecs, topologies, algorithms,
// aggregation rules): factories keyed by name, each building a T from a spec string
// "name[:key=value,...]" (common/spec.h) plus whatever context `Args` the kind needs. The rules
// are the same for every kind: a duplicate name is an error, an unknown name is InvalidArgument
// listing the known ones, and every parameter of a spec must be read by its factory, so a typo
// never falls back to a default. No process-wide instance: callers own registries and pass them
// in (leveldb's Env, gloo's transports).
//
// Thread-safety: Register must finish before concurrent use; the const methods are then
// thread-safe.
#ifndef TERN_COMMON_REGISTRY_H_
#define TERN_COMMON_REGISTRY_H_

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/spec.h"

namespace tern {

template <typename T, typename... Args>
class Registry {
 public:
  using Factory = std::function<absl::StatusOr<std::unique_ptr<T>>(SpecParams&, Args...)>;

  // `kind` names what is registered in messages ("codec", "topology", ...).
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  absl::Status Register(absl::string_view name, Factory factory) {
    if (name.empty() || factories_.count(name) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat(kind_, " '", name, "' registered twice (or with no name)"));
    }
    factories_.emplace(std::string(name), std::move(factory));
    return absl::OkStatus();
  }

  // Builds a T from "name" or "name:key=value,...". Unknown names, unknown or unused keys and
  // values out of range are InvalidArgument errors that say what is allowed.
  absl::StatusOr<std::unique_ptr<T>> Create(absl::string_view spec, Args... args) const {
    absl::StatusOr<std::pair<std::string, SpecParams>> parsed = SpecParams::ParseSpec(spec);
    if (!parsed.ok()) return parsed.status();
    auto& [name, params] = *parsed;
    auto it = factories_.find(name);
    if (it == factories_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown ", kind_, " '", name, "' (known: ", absl::StrJoin(Names(), ", "), ")"));
    }
    absl::StatusOr<std::unique_ptr<T>> made = it->second(params, std::forward<Args>(args)...);
    if (!made.ok()) return made.status();
    if (absl::Status s = params.CheckAllUsed(absl::StrCat(kind_, " '", name, "'")); !s.ok()) {
      return s;
    }
    return made;
  }

  bool Has(absl::string_view name) const { return factories_.count(name) > 0; }

  // Registered names, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [name, factory] : factories_) names.push_back(name);
    return names;
  }

  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  std::map<std::string, Factory, std::less<>> factories_;
};

}  // namespace tern

#endif  // TERN_COMMON_REGISTRY_H_
