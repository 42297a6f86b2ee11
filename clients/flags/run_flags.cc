// Which run a process belongs to and its seed: `tern worker`, `tern run` (both modes), `tern
// server`, `tern client` (command_table.cc: this file is their group).
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/train_flags.h"

ABSL_FLAG(std::string, run_id, "tern", "training: run id; workers refuse messages of other runs");
ABSL_FLAG(uint64_t, seed, 1, "training: seed of the data split, initial model and codecs");
