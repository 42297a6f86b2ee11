// gMock matchers for absl::Status / StatusOr (abseil 20220623 ships none), after leveldb's
// testutil.h and abseil's later status_matchers.h.
#ifndef TERN_TESTS_TESTING_STATUS_MATCHERS_H_
#define TERN_TESTS_TESTING_STATUS_MATCHERS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace tern::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status: " << s.ToString();
  return s.ok();
}

// StatusIs(code) or StatusIs(code, HasSubstr("...")).
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status: " << s.ToString();
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}
MATCHER_P(StatusIs, code, "") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status: " << s.ToString();
  return s.code() == code;
}

// The value of `s`, or a test failure and a value-initialised T: a test can chain on a call's
// result without dereferencing an error.
template <typename T>
T ValueOrFailure(absl::StatusOr<T> s) {
  if (!s.ok()) {
    ADD_FAILURE() << "status: " << s.status();
    return T{};
  }
  return *std::move(s);
}

#define TERN_ASSERT_OK(expr) ASSERT_THAT((expr), ::tern::testing::IsOk())
#define TERN_EXPECT_OK(expr) EXPECT_THAT((expr), ::tern::testing::IsOk())

}  // namespace tern::testing

#endif  // TERN_TESTS_TESTING_STATUS_MATCHERS_H_
