// Named recipes: a published method's flags under one name (--recipe=sparseloco), for `tern
// worker`, `tern launch`, `tern run` (both kinds) and `tern server`. A recipe fills in the flags
// it names that the command line (or a --flagfile) left out; a flag given wins, except the few a
// recipe cannot be without (diloco's algorithm, local-sgd rounds), which must agree.
#ifndef TERN_CLIENTS_FLAGS_RECIPE_FLAGS_H_
#define TERN_CLIENTS_FLAGS_RECIPE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(std::string, recipe);

namespace tern {

// Who runs the recipe: the workers among themselves (tern worker / launch / run) or an aggregator
// (tern server, tern run --mode=...).
enum class RecipeSide { kPeers, kAggregator };

struct RecipeFlag {
  const char* name;
  const char* value;
  bool required = false;  // a value given for it must be this one
};

struct Recipe {
  const char* name;
  std::vector<RecipeFlag> peers;       // empty: not among the workers
  std::vector<RecipeFlag> aggregator;  // empty: not through an aggregator
};

// Every recipe, in the order an unknown name's error lists them.
const std::vector<Recipe>& Recipes();

// Sets --recipe's flags for `side` that are not in `given` (the flag names on the command line and
// in its flagfiles). Nothing when --recipe is empty. InvalidArgument, changing nothing, for an
// unknown recipe, one `side` does not run, or a required flag given another value.
absl::Status ApplyRecipe(RecipeSide side, const std::vector<std::string>& given);

}  // namespace tern

#endif  // TERN_CLIENTS_FLAGS_RECIPE_FLAGS_H_
