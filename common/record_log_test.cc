#include "common/record_log.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

using ::testing::ElementsAre;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/record_log_", getpid(), "_", name);
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(RecordLog, ConcurrentAppendsAllComeBackWholeAndShareSyncs) {
  const std::string path = TempPath("concurrent");
  auto log = RecordLog::Create(path);
  ASSERT_TRUE(log.ok()) << log.status();
  constexpr int kThreads = 8, kEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        ASSERT_TRUE((*log)->Append(absl::StrCat(t, ":", i, std::string(i, 'x'))).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ((*log)->appended(), uint64_t{kThreads * kEach});
  EXPECT_LE((*log)->syncs(), (*log)->appended());
  auto records = ReadRecordLog(path);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), size_t{kThreads * kEach});
  // Each thread's records appear in its own order.
  std::vector<int> next(kThreads, 0);
  for (const std::string& r : *records) {
    const int t = r[0] - '0';
    EXPECT_EQ(r, absl::StrCat(t, ":", next[t], std::string(next[t], 'x')));
    ++next[t];
  }
}

TEST(RecordLog, ATornLastRecordIsDroppedAtEveryCut) {
  const std::string path = TempPath("torn");
  {
    auto log = RecordLog::Create(path);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Append("first").ok());
    ASSERT_TRUE((*log)->Append("second record").ok());
  }
  const std::string bytes = ReadAll(path);
  const size_t whole_first = 8 + 8 + 5;
  for (size_t cut = whole_first; cut < bytes.size(); ++cut) {
    auto records = ParseRecordLog(absl::string_view(bytes).substr(0, cut));
    ASSERT_TRUE(records.ok()) << cut << ": " << records.status();
    EXPECT_THAT(*records, ElementsAre("first")) << cut;
  }
  // The last record's payload damaged in place: torn, dropped.
  std::string damaged = bytes;
  damaged.back() ^= 1;
  EXPECT_THAT(*ParseRecordLog(damaged), ElementsAre("first"));
  // A cut inside the magic: a log that was being created, empty.
  EXPECT_TRUE(ParseRecordLog(bytes.substr(0, 3))->empty());
}

TEST(RecordLog, DamageBeforeTheLastRecordIsDataLoss) {
  const std::string path = TempPath("damaged");
  {
    auto log = RecordLog::Create(path);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Append("first").ok());
    ASSERT_TRUE((*log)->Append("second").ok());
  }
  std::string bytes = ReadAll(path);
  bytes[8 + 8] ^= 0x40;  // the first record's payload
  EXPECT_EQ(ParseRecordLog(bytes).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseRecordLog("NOTALOG!xxxxxxxx").status().code(), absl::StatusCode::kDataLoss);
}

TEST(RecordLog, AnOversizeLengthAtTheEndIsATornTailNotARead) {
  std::string bytes = kRecordLogMagic;
  bytes += std::string("\xff\xff\xff\xff\0\0\0\0", 8);  // 4 GiB claimed, nothing there
  auto records = ParseRecordLog(bytes);
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE(records->empty());
}

TEST(RecordLog, CreateReplacesTheOldLogAndAMissingFileIsEmpty) {
  const std::string path = TempPath("replace");
  EXPECT_TRUE(ReadRecordLog(path)->empty());
  {
    auto log = RecordLog::Create(path);
    ASSERT_TRUE((*log)->Append("old").ok());
  }
  auto fresh = RecordLog::Create(path);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(ReadRecordLog(path)->empty());
  ASSERT_TRUE((*fresh)->Append("new").ok());
  EXPECT_THAT(*ReadRecordLog(path), ElementsAre("new"));
}

}  // namespace
}  // namespace tern
