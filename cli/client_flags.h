// The flags of an aggregator run's built-in clients that `tern run --mode=federated|local-sgd|ps`
// passes on to its client processes too (defined in client_cmd.cc).
#ifndef TERN_CLI_CLIENT_FLAGS_H_
#define TERN_CLI_CLIENT_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "clients/flags/flag_types.h"

ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, clients);
ABSL_DECLARE_FLAG(std::string, attack);
ABSL_DECLARE_FLAG(tern::Double<tern::In(0, 1)>, attack_fraction);
ABSL_DECLARE_FLAG(std::string, client_delay_s);

#endif  // TERN_CLI_CLIENT_FLAGS_H_
