// What a caller of another daemon presents besides its certificate: `tern worker` (it calls its
// peers), `tern client`, `tern health` (command_table.cc: this file is their group).
#include "absl/flags/flag.h"
#include "clients/flags/service_flags.h"

ABSL_FLAG(std::string, token_file, "",
          "daemons and clients: a file holding this side's bearer token (tern tokens), sent on "
          "every call; needs --tls_ca");
