// The built-in model and its data: `tern worker`, `tern run` (both modes), `tern client`
// (command_table.cc: this file is their group).
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/train_flags.h"

ABSL_FLAG(std::string, model, "mlp:hidden=128x64", "training: softmax | mlp[:hidden=H1xH2...]");
ABSL_FLAG(std::string, data, "",
          "training: Fashion-MNIST directory ('' = /usr/share/datasets/fashion-mnist when "
          "present, else synthetic data)");
ABSL_FLAG(std::string, partition, "iid", "training: iid | dirichlet:alpha=A | classes:k=K");
