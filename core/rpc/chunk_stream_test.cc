#include "core/rpc/chunk_stream.h"

#include <string>
#include <utility>
#include <vector>

#include "common/chunking.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

// A synchronous stream's reading side over messages given up front; counts what it handed out.
struct FakeReader {
  bool Read(v1::BundleChunk* m) {
    if (next >= messages.size()) return false;
    *m = messages[next++];
    return true;
  }
  std::vector<v1::BundleChunk> messages;
  size_t next = 0;
};

v1::TensorBundle Bundle() {
  v1::TensorBundle b;
  b.set_run_id("r");
  b.add_tensors()->set_name(std::string(5000, 'x'));
  return b;
}

TEST(ChunkStream, ABundleIsReadWholeFromTheStartOrAfterAFirstMessageTheCallerRead) {
  const std::vector<v1::BundleChunk> chunks = *ChunkBundle(Bundle(), 7, /*max_chunk_bytes=*/1000);
  ASSERT_GT(chunks.size(), 3u);
  FakeReader whole{chunks};
  v1::BundleChunk first;
  absl::StatusOr<v1::TensorBundle> got = ReadChunkedBundle(&whole, &first);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->SerializeAsString(), Bundle().SerializeAsString());
  EXPECT_EQ(first.offset(), 0u);
  FakeReader rest{chunks};
  v1::BundleChunk head;
  ASSERT_TRUE(rest.Read(&head));
  got = ReadChunkedBundleFrom(&rest, std::move(head));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->run_id(), "r");
}

TEST(ChunkStream, ABadChunkIsAnErrorAndTheStreamIsReadToItsEnd) {
  std::vector<v1::BundleChunk> chunks = *ChunkBundle(Bundle(), 7, 1000);
  (*chunks[1].mutable_data())[3] ^= 1;
  FakeReader r{chunks};
  EXPECT_THAT(ReadChunkedBundle<v1::BundleChunk>(&r).status(),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(r.next, chunks.size()) << "drained, so the caller's Finish() is not left waiting";
  std::vector<v1::BundleChunk> all_but_last = *ChunkBundle(Bundle(), 7, 1000);
  all_but_last.pop_back();
  FakeReader cut{all_but_last};
  EXPECT_THAT(ReadChunkedBundle<v1::BundleChunk>(&cut).status(),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("before the last chunk")));
  FakeReader empty;
  EXPECT_THAT(ReadChunkedBundle<v1::BundleChunk>(&empty).status(),
              StatusIs(absl::StatusCode::kDataLoss));
}

}  // namespace
}  // namespace tern
