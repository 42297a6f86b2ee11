#include "common/file_util.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/tern-file-util-XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  EXPECT_NE(dir, nullptr);
  return dir == nullptr ? "/tmp" : dir;
}

TEST(FileUtil, WhatIsWrittenAtomicallyReadsBackWholeAndAnOverwriteReplacesIt) {
  const std::string path = TempDir() + "/f";
  const std::string big(300000, 'x');  // several read buffers
  ASSERT_TRUE(WriteFileAtomically(path, big).ok());
  absl::StatusOr<std::string> got = ReadFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, big);
  ASSERT_TRUE(WriteFileAtomically(path, std::string("a\0b", 3)).ok());
  EXPECT_EQ(*ReadFile(path), std::string("a\0b", 3));
  EXPECT_EQ(ReadFile(absl::StrCat(path, ".tmp.", getpid())).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(FileUtil, AMissingFileIsNotFoundAndAnUnwritableOneUnavailable) {
  const std::string dir = TempDir();
  EXPECT_EQ(ReadFile(dir + "/none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadFile(dir).status().code(), absl::StatusCode::kUnavailable);  // EISDIR
  const absl::Status s = WriteFileAtomically(dir + "/no/such/dir/f", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cannot write"), absl::string_view::npos) << s;
}

TEST(FileUtil, AnErrnoErrorSaysWhatFailedWhereAndWhy) {
  errno = ENOENT;
  const absl::Status s = ErrnoError("cannot open", "/no/such");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "cannot open /no/such: No such file or directory");
}

TEST(FileUtil, WhatIsAtAPathAndTheDirectoryHoldingIt) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "x").ok());
  EXPECT_TRUE(PathExists(dir + "/f") && !IsDirectory(dir + "/f"));
  EXPECT_TRUE(PathExists(dir) && IsDirectory(dir));
  EXPECT_FALSE(PathExists(dir + "/none") || IsDirectory(dir + "/none"));
  EXPECT_EQ(DirectoryOf("a/b/f"), "a/b/");
  EXPECT_EQ(DirectoryOf("/f"), "/");
  EXPECT_EQ(DirectoryOf("f"), ".");
}

}  // namespace
}  // namespace tern
