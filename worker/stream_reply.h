// Gossip.Stream's answer to one message (worker.proto StreamReply), both sides: the receiver's
// verdict written as bytes, and read back by the sender, who must not trust them.
//
// Thread-safety: free functions, no state.
#ifndef TERN_WORKER_STREAM_REPLY_H_
#define TERN_WORKER_STREAM_REPLY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"

namespace tern {

// The bytes of a StreamReply carrying `verdict` and the receiver's round.
grpc::ByteBuffer StreamReplyMessage(const absl::Status& verdict, int64_t receiver_round);

// Reads the verdict a StreamReply carries into `verdict`; INVALID_ARGUMENT, and `verdict` not
// set, when the bytes are no StreamReply (or one over kMaxStreamReplyBytes): then the stream
// itself is broken. A code gRPC does not know reads as UNKNOWN.
inline constexpr size_t kMaxStreamReplyBytes = 64 << 10;
absl::Status ParseStreamReply(absl::string_view bytes, absl::Status* verdict);
absl::Status ParseStreamReply(const grpc::ByteBuffer& message, absl::Status* verdict);

}  // namespace tern

#endif  // TERN_WORKER_STREAM_REPLY_H_
