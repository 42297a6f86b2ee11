#include "worker/stream_reply.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tern/v1/worker.pb.h"

namespace tern {

grpc::ByteBuffer StreamReplyMessage(const absl::Status& verdict, int64_t receiver_round) {
  v1::StreamReply reply;
  reply.set_receiver_round(static_cast<uint64_t>(std::max<int64_t>(receiver_round, 0)));
  reply.set_code(static_cast<uint32_t>(verdict.code()));
  reply.set_message(std::string(verdict.message()));
  grpc::Slice bytes(reply.SerializeAsString());
  return grpc::ByteBuffer(&bytes, 1);
}

absl::Status ParseStreamReply(absl::string_view bytes, absl::Status* verdict) {
  if (bytes.size() > kMaxStreamReplyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stream's reply of ", bytes.size(), " bytes, over ", kMaxStreamReplyBytes));
  }
  v1::StreamReply reply;
  if (!reply.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("a stream's reply that does not parse as a StreamReply");
  }
  const auto code = reply.code() > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)
                        ? absl::StatusCode::kUnknown
                        : static_cast<absl::StatusCode>(reply.code());
  *verdict = absl::Status(code, reply.message());  // OK when the code is 0
  return absl::OkStatus();
}

absl::Status ParseStreamReply(const grpc::ByteBuffer& message, absl::Status* verdict) {
  if (message.Length() > kMaxStreamReplyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a stream's reply of ", message.Length(),
                                                   " bytes, over ", kMaxStreamReplyBytes));
  }
  std::vector<grpc::Slice> slices;
  if (!message.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("a stream's reply that could not be read");
  }
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return ParseStreamReply(bytes, verdict);
}

}  // namespace tern
