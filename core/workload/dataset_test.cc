#include "core/workload/dataset.h"

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

std::string Idx(std::vector<uint32_t> dims, size_t data_bytes, uint8_t type = 0x08) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>(d >> shift));
  }
  for (size_t i = 0; i < data_bytes; ++i) s.push_back(static_cast<char>(i * 37));
  return s;
}

TEST(Idx, ParsesDimensionsAndData) {
  auto a = ParseIdx(Idx({2, 3, 4}, 24), 1000);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->dims, (std::vector<uint32_t>{2, 3, 4}));
  ASSERT_EQ(a->data.size(), 24u);
  EXPECT_EQ(a->data[5], static_cast<uint8_t>(5 * 37));
}

TEST(Idx, RejectsTruncationCorruptionAndOversize) {
  const std::string good = Idx({2, 3, 4}, 24);
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_THAT(ParseIdx(good.substr(0, n), 1000), StatusIs(absl::StatusCode::kInvalidArgument))
        << "prefix " << n;
  }
  EXPECT_THAT(ParseIdx(good + "x", 1000), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string bad_magic = good;
  bad_magic[0] = 1;
  EXPECT_THAT(ParseIdx(bad_magic, 1000), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseIdx(Idx({4}, 16, 0x0d), 1000),  // floats: not supported
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("element type")));
  EXPECT_THAT(ParseIdx(Idx({}, 0), 1000), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseIdx(Idx({1, 1, 1, 1, 1}, 1), 1000),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Dimensions whose product overflows or exceeds the cap are refused before any allocation.
  EXPECT_THAT(ParseIdx(Idx({0xffffffff, 0xffffffff, 0xffffffff}, 0), 1u << 30),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than")));
  EXPECT_THAT(ParseIdx(Idx({10, 10}, 100), 99), StatusIs(absl::StatusCode::kInvalidArgument));
}

class GzipFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tern_dataset_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(GzipFile, LoadsASmallFashionMnistLayoutAndNormalises) {
  Write("train-images-idx3-ubyte.gz", Idx({3, 2, 2}, 12));
  std::string labels = Idx({3}, 0);
  labels += std::string{1, 9, 0};
  Write("train-labels-idx1-ubyte.gz", labels);
  Write("t10k-images-idx3-ubyte.gz", Idx({1, 2, 2}, 4));
  Write("t10k-labels-idx1-ubyte.gz", Idx({1}, 0) + std::string(1, '\x04'));
  auto data = LoadTrainingData(dir_.string(), 1);
  ASSERT_THAT(data, IsOk());
  EXPECT_FALSE(data->synthetic);
  EXPECT_EQ(data->train.size(), 3u);
  EXPECT_EQ(data->train.dim, 4u);
  EXPECT_EQ(data->train.labels, (std::vector<uint8_t>{1, 9, 0}));
  EXPECT_NEAR(data->train.features[0], (0 / 255.0f - 0.2860f) / 0.3530f, 1e-6);
  EXPECT_EQ(data->test.size(), 1u);
}

TEST_F(GzipFile, RejectsBadLabelsMismatchedCountsAndMissingFiles) {
  Write("train-images-idx3-ubyte.gz", Idx({2, 2, 2}, 8));
  Write("train-labels-idx1-ubyte.gz", Idx({2}, 0) + std::string{1, 10});  // label 10
  Write("t10k-images-idx3-ubyte.gz", Idx({1, 2, 2}, 4));
  Write("t10k-labels-idx1-ubyte.gz", Idx({2}, 2));  // 2 labels for 1 image
  EXPECT_THAT(LoadFashionMnist(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label 10")));
  Write("train-labels-idx1-ubyte.gz", Idx({2}, 0) + std::string{1, 2});
  EXPECT_THAT(LoadFashionMnist(dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("matching")));
  EXPECT_THAT(LoadFashionMnist((dir_ / "nope").string()), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(GzipFile, RefusesToInflatePastTheCapAndReportsCorruptGzip) {
  const std::string path = Write("big.gz", std::string(100000, 'a'));
  EXPECT_THAT(ReadGzipFile(path, 1000), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ReadGzipFile(path, 100000), IsOk());
  // Corrupt the deflate stream in the middle of the file.
  std::string raw;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) raw.append(buf, n);
    std::fclose(f);
  }
  for (size_t i = 12; i < raw.size() - 8; ++i) raw[i] = static_cast<char>(raw[i] ^ 0x5a);
  const std::string bad = (dir_ / "bad.gz").string();
  FILE* f = std::fopen(bad.c_str(), "wb");
  std::fwrite(raw.data(), 1, raw.size(), f);
  std::fclose(f);
  EXPECT_THAT(ReadGzipFile(bad, 1 << 20), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Dataset, SyntheticDataIsReproducibleAndShapedLikeFashionMnist) {
  const TrainTest a = SyntheticData(100, 20, 7), b = SyntheticData(100, 20, 7);
  EXPECT_TRUE(a.synthetic);
  EXPECT_EQ(a.train.dim, 784u);
  EXPECT_EQ(a.train.features, b.train.features);
  EXPECT_EQ(a.test.labels, b.test.labels);
  EXPECT_NE(a.train.features, SyntheticData(100, 20, 8).train.features);
}

TEST(Dataset, RealFashionMnistLoadsWhenInstalled) {
  if (!std::filesystem::exists(std::string(kDefaultFashionMnistDir) +
                               "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  auto data = LoadFashionMnist(kDefaultFashionMnistDir);
  ASSERT_THAT(data, IsOk());
  EXPECT_EQ(data->train.size(), 60000u);
  EXPECT_EQ(data->test.size(), 10000u);
  EXPECT_EQ(data->train.dim, 784u);
  std::vector<int> count(10, 0);
  for (uint8_t y : data->test.labels) ++count[y];
  for (int c : count) EXPECT_EQ(c, 1000);  // the test split is balanced
}

}  // namespace
}  // namespace tern
