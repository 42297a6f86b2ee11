#include "cli/launcher_env.h"

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tern {
namespace {

// The first of `names` that is set: its name and value, or nothing.
std::optional<std::pair<std::string, std::string>> FirstSet(
    const std::function<const char*(const char*)>& getenv,
    std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* v = getenv(name); v != nullptr && *v != '\0') {
      return std::make_pair(std::string(name), std::string(v));
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<int>> Number(
    const std::optional<std::pair<std::string, std::string>>& var, int min, int max,
    std::string* said) {
  if (!var.has_value()) return std::optional<int>();
  int v = 0;
  if (!absl::SimpleAtoi(var->second, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        var->first, "=", var->second, ": not a whole number in [", min, ", ", max, "]"));
  }
  absl::StrAppend(said, said->empty() ? "" : " ", var->first, "=", v);
  return std::optional<int>(v);
}

}  // namespace

absl::StatusOr<LauncherEnv> ReadLauncherEnv(const std::function<const char*(const char*)>& getenv) {
  LauncherEnv env;
  absl::StatusOr<std::optional<int>> rank =
      Number(FirstSet(getenv, {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}), 0, 255, &env.said);
  if (!rank.ok()) return rank.status();
  absl::StatusOr<std::optional<int>> world = Number(
      FirstSet(getenv, {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"}), 1, 256, &env.said);
  if (!world.ok()) return world.status();
  env.rank = *rank;
  env.world = *world;
  if (env.rank.has_value() && env.world.has_value() && *env.rank >= *env.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("the launcher's rank ", *env.rank, " is not below its size ", *env.world));
  }
  if (auto s = FirstSet(getenv, {"TERN_SCHEDULER"}); s.has_value()) {
    env.scheduler = s->second;
    absl::StrAppend(&env.said, env.said.empty() ? "" : " ", "TERN_SCHEDULER=", s->second);
    return env;
  }
  const auto addr = FirstSet(getenv, {"MASTER_ADDR"});
  const auto port = FirstSet(getenv, {"MASTER_PORT"});
  if (!addr.has_value() || !port.has_value()) return env;
  int p = 0;
  if (!absl::SimpleAtoi(port->second, &p) || p < 1 || p > 65534) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", port->second,
                     ": not a port in [1, 65534] (tern's scheduler takes the "
                     "one above it)"));
  }
  env.scheduler = absl::StrCat(addr->second, ":", p + 1);
  if (env.rank == 0) env.serve_scheduler = env.scheduler;
  absl::StrAppend(&env.said, env.said.empty() ? "" : " ", "MASTER_ADDR=", addr->second,
                  " MASTER_PORT=", p);
  return env;
}

}  // namespace tern
