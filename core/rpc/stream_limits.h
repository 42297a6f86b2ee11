// Bounds on what incoming streams may hold in a daemon: how many are open (in total and per peer
// host), how many bytes of not-yet-accepted data they buffer together, how long one may sit
// without a message and how long one may last. A stream over the admission or buffering limits
// ends with RESOURCE_EXHAUSTED, the message naming the limit and its flag; one idle or open too
// long is cancelled (its caller sees CANCELLED); nothing else is disturbed. docs/robustness.md
// has the defaults.
//
// gRPC's own buffering is not counted here: a stream's flow-control window, fixed at 8 MiB by
// Http2Tuning (core/rpc/channel.h), is what gRPC may hold for it before its reactor reads it.
//
// Thread-safety: thread-safe. A Stream is used by its reactor only; the sweeper thread cancels
// streams through their cancel function, never under StreamLimits' lock.
#ifndef TERN_CORE_RPC_STREAM_LIMITS_H_
#define TERN_CORE_RPC_STREAM_LIMITS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace tern {

struct StreamLimitOptions {
  int max_streams = 512;          // --max_streams
  int max_streams_per_peer = 64;  // --max_streams_per_peer (peer = host, any port)
  // --max_buffered_mb: bytes all open streams may hold before their message is complete.
  uint64_t max_buffered_bytes = uint64_t{1} << 30;
  absl::Duration idle_timeout = absl::Seconds(60);  // --stream_idle_s
  absl::Duration max_duration = absl::Minutes(30);  // --stream_deadline_s
  absl::Duration sweep_every = absl::Seconds(1);    // 0: no sweeper thread (tests call Sweep)
};

class StreamLimits {
 public:
  class Stream;

  explicit StreamLimits(StreamLimitOptions options);
  ~StreamLimits();
  StreamLimits(const StreamLimits&) = delete;
  StreamLimits& operator=(const StreamLimits&) = delete;

  // Admits a stream from `peer` (gRPC's "ipv4:host:port" form, or any string); `cancel` ends it
  // (the reactor's ctx->TryCancel()) and is called at most once, by the sweeper. The Stream must
  // be destroyed before what `cancel` refers to (the reactor's OnDone).
  absl::StatusOr<std::unique_ptr<Stream>> Open(const std::string& peer,
                                               std::function<void()> cancel);
  // The same for an RPC of a callback-API server: its peer, cancelled with TryCancel().
  absl::StatusOr<std::unique_ptr<Stream>> Open(grpc::CallbackServerContext* ctx) {
    return Open(ctx->peer(), [ctx] { ctx->TryCancel(); });
  }

  // Changes the buffered-bytes budget (a worker learns its model's size at registration).
  void SetMaxBufferedBytes(uint64_t bytes);

  // Cancels streams idle or open for too long; returns how many. The sweeper calls it.
  int Sweep(absl::Time now);
  // Cancels every stream holding no data (one waiting for its next message, as a sender's
  // long-lived Gossip.Stream does between messages); returns how many. A server shutting down
  // calls it, or its graceful shutdown would wait its whole grace for streams that never end.
  int CancelWaiting();

  int open_streams() const;
  uint64_t buffered_bytes() const;

 private:
  struct Entry;
  void Close(Entry* e);
  void SweepLoop();
  // Cancels the streams `pick` picks (under the lock), outside the lock; returns how many.
  int CancelWhere(absl::FunctionRef<bool(const Entry&)> pick);

  StreamLimitOptions options_;
  mutable absl::Mutex mu_;
  uint64_t max_buffered_ ABSL_GUARDED_BY(mu_);
  uint64_t buffered_ ABSL_GUARDED_BY(mu_) = 0;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Entry>> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

// One admitted stream. Destroying it gives back its slot and its buffered bytes.
class StreamLimits::Stream {
 public:
  ~Stream();
  // Counts `bytes` more as held by this stream (and marks it active), or RESOURCE_EXHAUSTED if
  // that would take all streams over the budget (the bytes are then not counted).
  absl::Status Hold(uint64_t bytes);
  // The stream's data was handed on (accepted or refused): it holds nothing now.
  void ReleaseAll();

 private:
  friend class StreamLimits;
  Stream(StreamLimits* limits, std::shared_ptr<Entry> entry)
      : limits_(limits), entry_(std::move(entry)) {}
  StreamLimits* const limits_;
  const std::shared_ptr<Entry> entry_;
};

// "ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1", "ipv6:[::1]:5000" -> "ipv6:[::1]"; other forms as is.
std::string PeerHost(const std::string& peer);

}  // namespace tern

#endif  // TERN_CORE_RPC_STREAM_LIMITS_H_
