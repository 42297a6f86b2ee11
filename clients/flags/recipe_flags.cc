// --recipe: `tern worker`, `tern launch`, `tern run` (both kinds), `tern server`
// (command_table.cc: this file is their group).
#include "clients/flags/recipe_flags.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

ABSL_FLAG(
    std::string, recipe, "",
    "training: a published method's flags under one name, filling in those not given: "
    "diloco | streaming-diloco | sparseloco | streaming-signs | average-signs (docs/worker.md "
    "\"Recipes\")");

namespace tern {

const std::vector<Recipe>& Recipes() {
  // The papers' settings (../shared/ALGORITHMS.md §5); H (--local_steps) is the user's: it
  // follows from the link (docs/benchmarks.md).
  static const std::vector<Recipe>* const kRecipes = new std::vector<Recipe>{
      // DiLoCo: the user's inner optimizer, every H steps an outer Nesterov step (lr 0.7,
      // momentum 0.9) on the group's mean update, sent whole.
      {.name = "diloco",
       .peers = {{"algorithm", "diloco", true},
                 {"topology", "complete", true},
                 {"outer", "nesterov:lr=0.7,momentum=0.9"},
                 {"codec", "none"}},
       .aggregator = {{"mode", "local-sgd", true},
                      {"outer", "nesterov:lr=0.7,momentum=0.9"},
                      {"update_codec", "none"}}},
      // Streaming DiLoCo: DiLoCo in 4 fragments taking turns, each update in 4-bit floats, the
      // exchange overlapping 2 inner steps and merged half and half.
      {.name = "streaming-diloco",
       .peers = {{"algorithm", "diloco", true},
                 {"topology", "complete", true},
                 {"outer", "nesterov:lr=0.7,momentum=0.9"},
                 {"codec", "fp4"},
                 {"fragments", "4"},
                 {"fragment_cut", "strided"},
                 {"overlap", "true"},
                 {"overlap_steps", "2"},
                 {"merge_alpha", "0.5"}},
       .aggregator = {}},
      // SparseLoCo: per chunk of 4,096 the 64 largest values of the update in 2 bits, error
      // feedback decaying by 0.95 in place of outer momentum, outer lr 1.
      {.name = "sparseloco",
       .peers = {{"algorithm", "diloco", true},
                 {"topology", "complete", true},
                 {"outer", "sparseloco:lr=1,beta=0.95"},
                 {"codec", "chunk-topk:chunk=4096,k=64,bits=2"}},
       .aggregator = {{"mode", "local-sgd", true},
                      {"outer", "sparseloco:lr=1,beta=0.95"},
                      {"update_codec", "chunk-topk:chunk=4096,k=64,bits=2"}}},
      // tern's own for a slow link at a short H (3): the model in 3 fragments taking turns,
      // each update's signs with one scale per 1,024 values and error feedback, the exchange
      // overlapping one inner step that is kept, and a gentle outer Nesterov step (lr 1,
      // momentum 0.3). Measured at 10 Mbit/s, 100 ms (docs/benchmarks.md).
      {.name = "streaming-signs",
       .peers = {{"algorithm", "diloco", true},
                 {"topology", "complete", true},
                 {"outer", "nesterov:lr=1,momentum=0.3"},
                 {"codec", "sign"},
                 {"fragments", "3"},
                 {"overlap", "true"},
                 {"keep_overlap", "true"}},
       .aggregator = {}},
      // tern's own for 100 Mbit/s to 1 Gbit/s: the whole model's update in signs (one scale per
      // 1,024 values, error feedback) every H steps (3 at 100 Mbit/s, 100 ms; 1 at 1 Gbit/s),
      // plainly averaged, the exchange overlapping one inner step that is kept. The race's
      // tern-average-sign-keep row (docs/benchmarks.md).
      {.name = "average-signs",
       .peers = {{"algorithm", "diloco", true},
                 {"topology", "complete", true},
                 {"outer", "average"},
                 {"codec", "sign"},
                 {"overlap", "true"},
                 {"keep_overlap", "true"}},
       .aggregator = {}},
  };
  return *kRecipes;
}

absl::Status ApplyRecipe(RecipeSide side, const std::vector<std::string>& given) {
  const std::string name = absl::GetFlag(FLAGS_recipe);
  if (name.empty()) return absl::OkStatus();
  const std::vector<Recipe>& all = Recipes();
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const Recipe& r) { return r.name == name; });
  if (it == all.end()) {
    std::vector<std::string> names;
    for (const Recipe& r : all) names.emplace_back(r.name);
    return absl::InvalidArgumentError(
        absl::StrCat("--recipe=", name, ": no such recipe (", absl::StrJoin(names, ", "), ")"));
  }
  const bool peers = side == RecipeSide::kPeers;
  const std::vector<RecipeFlag>& flags = peers ? it->peers : it->aggregator;
  if (flags.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recipe=", name,
                     peers ? " runs through an aggregator only (tern server)"
                           : " runs among the workers only (tern worker, tern run)"));
  }
  // Checked whole before any flag is set: a refused recipe changes nothing.
  std::vector<std::pair<absl::CommandLineFlag*, const RecipeFlag*>> to_set;
  for (const RecipeFlag& f : flags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f.name);
    if (flag == nullptr) {
      return absl::InternalError(absl::StrCat("--recipe=", name, ": no flag --", f.name));
    }
    // A boolean given as --noNAME is given too.
    const bool is_given =
        std::find(given.begin(), given.end(), f.name) != given.end() ||
        std::find(given.begin(), given.end(), absl::StrCat("no", f.name)) != given.end();
    if (!is_given) {
      to_set.emplace_back(flag, &f);
    } else if (f.required && flag->CurrentValue() != f.value) {
      return absl::InvalidArgumentError(absl::StrCat("--recipe=", name, " needs --", f.name, "=",
                                                     f.value, ", not ", flag->CurrentValue()));
    }
  }
  for (const auto& [flag, f] : to_set) {
    std::string error;
    if (!flag->ParseFrom(f->value, &error)) {
      return absl::InternalError(
          absl::StrCat("--recipe=", name, ": --", f->name, "=", f->value, ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace tern
