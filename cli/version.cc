// `tern version` and `--version`: the version, the build CMake configured, and the OpenBLAS
// kernels the binary runs.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "core/workload/blas_core.h"

namespace tern {

std::string VersionString() {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  return absl::StrCat("tern 0.1.0 (wire format tern.v1, ", TERN_BUILD_TYPE,
                      " build)\nOpenBLAS kernels: ", BlasCoreName(),
                      set == nullptr ? "" : absl::StrCat(" (OPENBLAS_CORETYPE=", set, ")"));
}

int VersionMain(const std::vector<std::string>&) {
  std::printf("%s\n", VersionString().c_str());
  return 0;
}

}  // namespace tern
