#include "common/record_log.h"

#include <stdlib.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

using ::testing::ElementsAre;

// A path in a fresh directory: a log left by an earlier run (whose process had the same pid, as
// a container's often do) must not be read back as this one's.
std::string TempPath(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/record_log_XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << dir;
  return absl::StrCat(dir, "/", name);
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
  auto log_read = ReadRecordLog(path);
  ASSERT_TRUE(log_read.ok()) << log_read.status();
  const std::vector<std::string>* records = &log_read->records;
  ASSERT_EQ(records->size(), size_t{kThreads * kEach});
  // Each thread's records appear in its own order.
  std::vector<int> next(kThreads, 0);
  for (const std::string& r : *records) {
    const int t = r[0] - '0';
    EXPECT_EQ(r, absl::StrCat(t, ":", next[t], std::string(next[t], 'x')));
    ++next[t];
  }
}

// A log of two records: "first" and "second record".
std::string TwoRecords(const std::string& name) {
  const std::string path = TempPath(name);
  {
    auto log = RecordLog::Create(path);
    EXPECT_TRUE(log.ok());
    EXPECT_TRUE((*log)->Append("first").ok());
    EXPECT_TRUE((*log)->Append("second record").ok());
  }
  return ReadAll(path);
}

constexpr size_t kWholeFirst = 8 + kRecordHeaderBytes + 5;

TEST(RecordLog, AnIncompleteLastWriteIsATornTailDroppedAtEveryCut) {
  const std::string bytes = TwoRecords("torn");
  ASSERT_EQ(bytes.size(), kWholeFirst + kRecordHeaderBytes + 13);
  for (size_t cut = kWholeFirst; cut < bytes.size(); ++cut) {
    auto log = ParseRecordLog(absl::string_view(bytes).substr(0, cut));
    ASSERT_TRUE(log.ok()) << cut << ": " << log.status();
    EXPECT_THAT(log->records, ElementsAre("first")) << cut;
    EXPECT_EQ(log->torn_bytes, cut - kWholeFirst);
  }
  // Space the file system extended the file with, never written: zeros after the last record.
  auto zeros = ParseRecordLog(bytes + std::string(40, '\0'));
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  EXPECT_THAT(zeros->records, ElementsAre("first", "second record"));
  EXPECT_EQ(zeros->torn_bytes, 40u);
  // A cut inside the magic: a log that was being created, empty.
  EXPECT_TRUE(ParseRecordLog(bytes.substr(0, 3))->records.empty());
}

TEST(RecordLog, AnyByteDamagedAfterTheMagicIsDataLossNamingTheRecordAndOffset) {
  const std::string bytes = TwoRecords("damaged");
  // Every bit of every byte, the last record's too: a complete record is never taken for torn.
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = bytes;
      damaged[i] ^= static_cast<char>(1 << bit);
      auto log = ParseRecordLog(damaged);
      ASSERT_EQ(log.status().code(), absl::StatusCode::kDataLoss) << "byte " << i << " bit " << bit;
      const std::string says(log.status().message());
      if (i >= kWholeFirst) {
        EXPECT_THAT(says, ::testing::HasSubstr(absl::StrCat("record 1 at byte ", kWholeFirst)));
      } else if (i >= 8) {
        EXPECT_THAT(says, ::testing::HasSubstr("record 0 at byte 8"));
      } else {
        EXPECT_THAT(says, ::testing::HasSubstr("bad magic"));
      }
    }
  }
  EXPECT_EQ(ParseRecordLog("NOTALOG!xxxxxxxx").status().code(), absl::StatusCode::kDataLoss);
}

TEST(RecordLog, AFormatOneLogIsReadByItsOldRule) {
  std::string v1 = kRecordLogMagicV1;
  const auto add = [&v1](const std::string& payload) {
    const uint32_t n = static_cast<uint32_t>(payload.size());
    const uint32_t crc = Crc32(payload.data(), payload.size());
    v1.append(reinterpret_cast<const char*>(&n), 4);
    v1.append(reinterpret_cast<const char*>(&crc), 4);
    v1 += payload;
  };
  add("one");
  add("two");
  EXPECT_THAT(ParseRecordLog(v1)->records, ElementsAre("one", "two"));
  std::string torn = v1;
  torn.back() ^= 1;  // format 1 cannot tell this from a torn write
  EXPECT_THAT(ParseRecordLog(torn)->records, ElementsAre("one"));
}

TEST(RecordLog, TheLengthFileTellsACutAtARecordBoundaryFromAShortLog) {
  const std::string path = TempPath("length");
  {
    auto log = RecordLog::Create(path);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Append("first").ok());
    ASSERT_TRUE((*log)->Append("second").ok());
  }
  const std::string bytes = ReadAll(path);
  auto whole = ReadRecordLog(path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_THAT(whole->records, ElementsAre("first", "second"));
  EXPECT_EQ(whole->acknowledged_bytes, bytes.size());
  // Cut after the first record: a well-formed shorter log, which the length file refutes.
  std::ofstream(path, std::ios::trunc | std::ios::binary) << bytes.substr(0, 8 + 12 + 5);
  auto cut = ReadRecordLog(path);
  EXPECT_TRUE(absl::IsDataLoss(cut.status())) << cut.status();
  EXPECT_THAT(std::string(cut.status().message()), ::testing::HasSubstr("acknowledged"));
  // An interrupted append after everything acknowledged is a torn tail.
  std::ofstream(path, std::ios::trunc | std::ios::binary) << bytes + bytes.substr(8, 15);
  auto torn = ReadRecordLog(path);
  ASSERT_TRUE(torn.ok()) << torn.status();
  EXPECT_THAT(torn->records, ElementsAre("first", "second"));
  EXPECT_EQ(torn->torn_bytes, 15u);
  // A damaged length file is damage, not a shorter log.
  std::string length = ReadAll(LogLengthPath(path));
  ASSERT_EQ(length.size(), kLogLengthFileBytes);
  length[10] ^= 1;
  std::ofstream(LogLengthPath(path), std::ios::trunc | std::ios::binary) << length;
  EXPECT_TRUE(absl::IsDataLoss(ReadRecordLog(path).status()));
  // Without one (a log an older tern wrote) the old rule holds.
  ASSERT_EQ(unlink(LogLengthPath(path).c_str()), 0);
  std::ofstream(path, std::ios::trunc | std::ios::binary) << bytes.substr(0, 8 + 12 + 5);
  auto old = ReadRecordLog(path);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_THAT(old->records, ElementsAre("first"));
}

TEST(RecordLog, ALengthFileTruncatedCorruptOrOversizeIsDataLoss) {
  const std::string path = TempPath("length_bytes");
  ASSERT_TRUE(RecordLog::Create(path).ok());
  const std::string good = ReadAll(LogLengthPath(path));
  auto parsed = ParseLogLength(good);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, 8u);  // the magic alone
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_TRUE(absl::IsDataLoss(ParseLogLength(good.substr(0, cut)).status())) << cut;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    EXPECT_TRUE(absl::IsDataLoss(ParseLogLength(bad).status())) << i;
  }
  EXPECT_TRUE(absl::IsDataLoss(ParseLogLength(good + "x").status()));
}

TEST(RecordLog, CreateReplacesTheOldLogAndAMissingFileIsEmpty) {
  const std::string path = TempPath("replace");
  EXPECT_TRUE(ReadRecordLog(path)->records.empty());
  EXPECT_FALSE(ReadRecordLog(path)->exists);
  {
    auto log = RecordLog::Create(path);
    ASSERT_TRUE((*log)->Append("old").ok());
  }
  auto fresh = RecordLog::Create(path);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(ReadRecordLog(path)->records.empty());
  EXPECT_TRUE(ReadRecordLog(path)->exists);
  ASSERT_TRUE((*fresh)->Append("new").ok());
  EXPECT_THAT(ReadRecordLog(path)->records, ElementsAre("new"));
}

}  // namespace
}  // namespace tern
