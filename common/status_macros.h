// Status propagation macros. abseil 20220623 has absl::Status/StatusOr but not these macros; these
// follow absl/status/status_macros.h of later releases.
#ifndef TERN_COMMON_STATUS_MACROS_H_
#define TERN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TERN_STATUS_CONCAT_INNER_(a, b) a##b
#define TERN_STATUS_CONCAT_(a, b) TERN_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define TERN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status tern_status_ = (expr);        \
    if (!tern_status_.ok()) return tern_status_; \
  } while (0)

// TERN_ASSIGN_OR_RETURN(auto x, MakeX()); assigns the value of an absl::StatusOr or returns its
// error status from the enclosing function.
#define TERN_ASSIGN_OR_RETURN(lhs, expr) \
  TERN_ASSIGN_OR_RETURN_IMPL_(TERN_STATUS_CONCAT_(tern_statusor_, __LINE__), lhs, expr)
#define TERN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)   \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // TERN_COMMON_STATUS_MACROS_H_
