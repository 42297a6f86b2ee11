#include "worker/stream_reply.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tern/v1/worker.pb.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::StatusIs;

std::string Bytes(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// The verdict `bytes` carry, or why they carry none.
absl::Status Verdict(const grpc::ByteBuffer& b, absl::Status* parse = nullptr) {
  absl::Status v = absl::UnknownError("not set");
  absl::Status p = ParseStreamReply(b, &v);
  if (parse != nullptr) *parse = p;
  return v;
}

TEST(StreamReply, AVerdictReadsBackAsWritten) {
  EXPECT_TRUE(Verdict(StreamReplyMessage(absl::OkStatus(), 7)).ok());
  const absl::Status refused = absl::FailedPreconditionError("round 3 is over");
  absl::Status parse;
  EXPECT_EQ(Verdict(StreamReplyMessage(refused, 7), &parse), refused);
  EXPECT_TRUE(parse.ok());
  // From a contiguous string as from gRPC's slices.
  absl::Status v;
  ASSERT_TRUE(ParseStreamReply(Bytes(StreamReplyMessage(refused, 7)), &v).ok());
  EXPECT_EQ(v, refused);
}

TEST(StreamReply, ACodeGrpcDoesNotKnowReadsAsUnknown) {
  v1::StreamReply r;
  r.set_code(99);
  r.set_message("odd");
  absl::Status v;
  ASSERT_TRUE(ParseStreamReply(r.SerializeAsString(), &v).ok());
  EXPECT_THAT(v, StatusIs(absl::StatusCode::kUnknown));
}

TEST(StreamReply, TruncatedCorruptAndOversizeRepliesAreErrorsNotVerdicts) {
  const std::string whole =
      Bytes(StreamReplyMessage(absl::InvalidArgumentError("a NaN in part x"), 1u << 20));
  absl::Status v;
  for (size_t n = 1; n < whole.size(); ++n) {
    // A cut reply either fails to parse or reads as some verdict; it never crashes.
    (void)ParseStreamReply(absl::string_view(whole).substr(0, n), &v);
  }
  // Cut inside its message string: no verdict.
  EXPECT_THAT(ParseStreamReply(absl::string_view(whole).substr(0, whole.size() - 3), &v),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A field of wire type 7 exists in no protobuf.
  EXPECT_THAT(ParseStreamReply(std::string("\x0f\x01", 2), &v),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A length-delimited field running past the end.
  EXPECT_THAT(ParseStreamReply(std::string("\x1a\x7f"
                                           "abc",
                                           5),
                               &v),
              StatusIs(absl::StatusCode::kInvalidArgument));
  v = absl::OkStatus();
  EXPECT_THAT(ParseStreamReply(std::string(kMaxStreamReplyBytes + 1, '\0'), &v),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("over")));
  EXPECT_TRUE(v.ok()) << "left as it was";
}

}  // namespace
}  // namespace tern
