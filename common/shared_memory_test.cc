#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

std::string UniqueName() { return absl::StrCat("/tern-test-", getpid(), "-", rand()); }

TEST(SharedSegment, AnotherMappingOfItsPathSeesTheSameBytesAndItIsGoneWhenDestroyed) {
  const std::string name = UniqueName();
  auto seg = SharedSegment::Create(name, 4096);
  ASSERT_THAT(seg.status(), IsOk());
  const std::string path = (*seg)->path();
  std::memcpy((*seg)->data(), "tern", 4);

  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(std::memcmp(p, "tern", 4), 0);
  static_cast<char*>(p)[4000] = 'x';  // and the other way
  EXPECT_EQ((*seg)->data()[4000], 'x');
  munmap(p, 4096);

  EXPECT_THAT(SharedSegment::Create(name, 4096).status(),
              StatusIs(absl::StatusCode::kInternal));  // exists
  seg->reset();
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST(SharedSegment, RefusesBadNamesAndAnEmptySize) {
  EXPECT_THAT(SharedSegment::Create("no-slash", 64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SharedSegment::Create("/a/b", 64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SharedSegment::Create(UniqueName(), 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
