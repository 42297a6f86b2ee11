// The gossip graph: `tern worker`, `tern run`, `tern scheduler` (command_table.cc: this file is
// their group).
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/train_flags.h"

ABSL_FLAG(std::string, topology, "ring",
          "training: ring | torus | exponential | one-peer-exponential | random-matching | "
          "complete");
ABSL_FLAG(std::string, weights, "auto", "training: mixing weights: auto | uniform | metropolis");
