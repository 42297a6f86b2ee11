// Small pieces shared by the callback-API servers (worker daemon, aggregator, scheduler):
// starting one, reassembling a
// chunked bundle one chunk at a time, streaming a prepared list of replies, and building chunked
// replies whose first message carries a header.
//
// Thread-safety: free functions over the caller's objects.
#ifndef TERN_WORKER_RPC_UTIL_H_
#define TERN_WORKER_RPC_UTIL_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Builds and starts a server for `services` on `listen` with the health (serving) and
// reflection services on; `port` gets the bound port. A request is one chunk (<= 1 MiB of data)
// plus a small header, so that is the largest message taken.
inline absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, const std::vector<grpc::Service*>& services, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), port);
  for (grpc::Service* s : services) builder.RegisterService(s);
  builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxChunkBytes + (64 << 10)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

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

// Feeds one chunk of a bundle stream: nullopt while more chunks are needed, then the bundle or
// the error that ends the stream.
inline std::optional<absl::StatusOr<v1::TensorBundle>> Feed(BundleAssembler& a,
                                                            const v1::BundleChunk& chunk) {
  if (absl::Status s = a.Add(chunk); !s.ok()) return absl::StatusOr<v1::TensorBundle>(s);
  if (!a.complete()) return std::nullopt;
  return a.Finish();
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

}  // namespace tern

#endif  // TERN_WORKER_RPC_UTIL_H_
