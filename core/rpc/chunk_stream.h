// Streams of bundle chunks on both sides of a call: a callback-API server reassembling a chunked
// bundle one chunk at a time, streaming a prepared list of replies (the first carrying a
// header); a synchronous client writing a bundle's chunks or reading a chunked reply.
//
// Thread-safety: free functions over the caller's objects.
#ifndef TERN_CORE_RPC_CHUNK_STREAM_H_
#define TERN_CORE_RPC_CHUNK_STREAM_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/rpc/raw_chunk.h"
#include "core/rpc/stream_limits.h"
#include "grpcpp/grpcpp.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Replies of a streamed bundle: the first carries `header` in the field that `mutable_header`
// names, each a chunk.
template <typename Reply, typename Header>
absl::StatusOr<std::vector<Reply>> ChunkedReplies(const v1::TensorBundle& bundle,
                                                  uint64_t stream_id,
                                                  Header* (Reply::*mutable_header)(),
                                                  const Header& header) {
  TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(bundle, stream_id));
  std::vector<Reply> replies(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i == 0) *(replies[0].*mutable_header)() = header;
    *replies[i].mutable_chunk() = std::move(chunks[i]);
  }
  return replies;
}

// Feeds one chunk of a bundle stream, taking its data over: nullopt while more chunks are needed,
// then the bundle or the error that ends the stream.
inline std::optional<absl::StatusOr<v1::TensorBundle>> Feed(BundleAssembler& a,
                                                            v1::BundleChunk&& chunk) {
  if (absl::Status s = a.Add(std::move(chunk)); !s.ok()) {
    return absl::StatusOr<v1::TensorBundle>(s);
  }
  if (!a.complete()) return std::nullopt;
  return a.Finish();
}

// Feed, with the chunk's bytes counted against `stream`'s share of the daemon's buffering budget
// until the bundle is complete (then it is handed on and counts no more), or, with
// `release_when_whole` false, until the caller releases them (it holds the bundle on; a bad
// chunk still gives them back). Over the budget: the RESOURCE_EXHAUSTED that ends the stream.
inline std::optional<absl::StatusOr<v1::TensorBundle>> FeedCounted(StreamLimits::Stream& stream,
                                                                   BundleAssembler& a,
                                                                   v1::BundleChunk&& chunk,
                                                                   bool release_when_whole = true) {
  if (absl::Status s = stream.Hold(chunk.data().size()); !s.ok()) {
    return absl::StatusOr<v1::TensorBundle>(s);
  }
  std::optional<absl::StatusOr<v1::TensorBundle>> got = Feed(a, std::move(chunk));
  if (got && (release_when_whole || !got->ok())) stream.ReleaseAll();
  return got;
}

// FeedCounted for a chunk received raw (its data read in place from gRPC's slices): the large
// payloads that the assembler's observer reads in pieces stay in those slices (ReceivedBundle).
inline std::optional<absl::StatusOr<ReceivedBundle>> FeedCounted(StreamLimits::Stream& stream,
                                                                 BundleAssembler& a,
                                                                 const RawChunk& chunk) {
  std::optional<absl::StatusOr<ReceivedBundle>> got;
  if (absl::Status s = stream.Hold(chunk.data_size); !s.ok()) {
    got = absl::StatusOr<ReceivedBundle>(s);
  } else if (absl::Status added = a.Add(chunk.header, chunk.data, chunk.owner); !added.ok()) {
    got = absl::StatusOr<ReceivedBundle>(added);
  } else if (a.complete()) {
    got = a.FinishInPlace();
  }
  if (got) stream.ReleaseAll();
  return got;
}

// The OnWriteDone of a reactor that streams `out` in order and then finishes OK.
template <typename Reactor, typename Message>
void WriteNextOrFinish(Reactor* r, bool ok, const std::vector<Message>& out, size_t* next) {
  if (!ok) {
    r->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
  } else if (++*next < out.size()) {
    r->StartWrite(&out[*next]);
  } else {
    r->Finish(grpc::Status::OK);
  }
}

// Writes `chunks` to a synchronous client stream as `Request` messages (each with its chunk in
// the `chunk` field); `header(request)` fills the first one's header fields. Stops at the first
// failed write (the caller's Finish() then says why); the caller calls WritesDone and Finish.
template <typename Request, typename Writer, typename Header>
void WriteChunks(Writer* writer, std::vector<v1::BundleChunk> chunks, Header header) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    Request r;
    if (i == 0) header(r);
    *r.mutable_chunk() = std::move(chunks[i]);
    if (!writer->Write(r)) break;
  }
}

// The chunk a streamed message carries: the message itself, or its `chunk` field.
inline v1::BundleChunk& ChunkOf(v1::BundleChunk& c) { return c; }
template <typename Msg>
v1::BundleChunk& ChunkOf(Msg& m) {
  return *m.mutable_chunk();
}

// Reads one chunked bundle from a synchronous gRPC stream of `Msg` (a reader or reader-writer)
// whose first message the caller has read already (`first`, to look at what rides in it before
// the bundle: a task, a reply's result). After a bad chunk it reads the stream to its end, so the
// caller's Finish() returns the server's status instead of waiting on unread messages; the caller
// still Finish()es the stream.
template <typename Msg, typename Reader>
absl::StatusOr<v1::TensorBundle> ReadChunkedBundleFrom(Reader* reader, Msg first) {
  BundleAssembler assembler(uint64_t{1} << 31);
  Msg msg = std::move(first);
  do {
    if (absl::Status s = assembler.Add(std::move(ChunkOf(msg))); !s.ok()) {
      while (reader->Read(&msg)) {
      }
      return s;
    }
  } while (!assembler.complete() && reader->Read(&msg));
  if (!assembler.complete()) return absl::DataLossError("stream ended before the last chunk");
  return assembler.Finish();
}

// The same from the stream's start; `first`, when given, receives the stream's first message
// (where header fields ride).
template <typename Msg, typename Reader>
absl::StatusOr<v1::TensorBundle> ReadChunkedBundle(Reader* reader, Msg* first = nullptr) {
  Msg msg;
  if (!reader->Read(&msg)) return absl::DataLossError("stream ended before the last chunk");
  if (first != nullptr) *first = msg;
  return ReadChunkedBundleFrom(reader, std::move(msg));
}

}  // namespace tern

#endif  // TERN_CORE_RPC_CHUNK_STREAM_H_
