// The receiving end of a striped Gossip.Push (docs/wire-format.md, "Striped pushes"): a sender
// spreads one large bundle over several streams on several connections (chunk i on stream
// i mod k), all with the same stream_id and `stripes`. StripeJoins matches the streams of one
// push by (caller, stream_id) and feeds their chunks to one assembler in offset order, CRC and
// parse in one pass as on a single stream. A chunk that arrives ahead of the parse position waits
// in its gRPC slices (no copy), counted by its stream against the daemon's StreamLimits (the
// member holds it there before Add), so an idle or over-budget join ends as any stream does.
//
// A join ends once: the bundle is complete and handed to `Outcome` (the engine's Deliver), or a
// chunk is refused, or a member stream goes away first. Every member then finishes its RPC with
// the outcome's status; `Outcome` runs once, also for a failure, so a refusal is counted once.
//
// Thread-safety: thread-safe. Members call in from gRPC's threads concurrently. The assembler is
// fed by one thread at a time (whichever finds it idle), outside the lock; `Outcome` and
// StripeMember::JoinDone never run under a lock.
#ifndef TERN_WORKER_STRIPE_JOIN_H_
#define TERN_WORKER_STRIPE_JOIN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/chunking.h"
#include "core/rpc/raw_chunk.h"
#include "kernels/payload_scans.h"
#include "kernels/registry.h"

namespace tern {

// Most streams one push may be spread over.
inline constexpr uint32_t kMaxStripes = 16;

// A stream taking part in a join (the daemon's Push reactor).
class StripeMember {
 public:
  virtual ~StripeMember() = default;
  // The join's outcome, for a member that ended its reads first and was told to wait. Called at
  // most once, from another member's thread (or the one leaving), never under a lock.
  virtual void JoinDone(const absl::Status& outcome) = 0;
};

class StripeJoin;

class StripeJoins {
 public:
  // Takes the complete bundle (or why there is none) of `caller`'s push (as Attach had it) and
  // returns what the members answer.
  using Outcome =
      std::function<absl::Status(const std::string& caller, absl::StatusOr<ReceivedBundle> bundle,
                                 uint64_t wire_bytes, PayloadScans* scans)>;

  // `codecs` must outlive this; so must every join (each member ends before the daemon's
  // server, and so before this).
  StripeJoins(const CodecRegistry* codecs, uint64_t max_bundle_bytes, Outcome outcome)
      : codecs_(codecs), max_bundle_bytes_(max_bundle_bytes), outcome_(std::move(outcome)) {}
  ~StripeJoins();
  StripeJoins(const StripeJoins&) = delete;
  StripeJoins& operator=(const StripeJoins&) = delete;

  // The join that `first` (a stream's first chunk, stripes > 1) names for `caller` (the peer's
  // host and principal), made if new, with the stream counted in as a member. InvalidArgument for
  // this stream alone if its stripe fields disagree with the join's, or the join has all its
  // members.
  absl::StatusOr<std::shared_ptr<StripeJoin>> Attach(const std::string& caller,
                                                     const ChunkHeader& first);

  int open_joins() const;

 private:
  friend class StripeJoin;
  using Key = std::pair<std::string, uint64_t>;
  void Forget(const Key& key, const StripeJoin* join);

  const CodecRegistry* const codecs_;
  const uint64_t max_bundle_bytes_;
  const Outcome outcome_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::weak_ptr<StripeJoin>> joins_ ABSL_GUARDED_BY(mu_);
};

class StripeJoin {
 public:
  StripeJoin(StripeJoins* owner, StripeJoins::Key key, uint64_t total_size, uint32_t stripes);
  ~StripeJoin();

  // Takes one chunk of a member's stream. Returns the join's outcome once it is known (the member
  // finishes its RPC with it), else nullopt: read on.
  std::optional<absl::Status> Add(RawChunk chunk);
  // `member`'s stream has ended its reads. Returns the outcome if known; else nullopt, and the
  // member waits for JoinDone.
  std::optional<absl::Status> EndOfStream(StripeMember* member);
  // `member` goes away (its RPC was cancelled, or it finished). A join without an outcome fails.
  // True if `member` was waiting for JoinDone, which will now not come: it finishes itself.
  bool Leave(StripeMember* member, const absl::Status& why);

 private:
  friend class StripeJoins;
  enum class State { kOpen, kDeciding, kDone };

  // Checks a chunk's stripe fields against the join's.
  absl::Status CheckFields(const ChunkHeader& h) const;
  // Whether `n` bytes at `at` lie past the parse position, within the bundle, and clear of every
  // chunk waiting.
  bool FitsLocked(uint64_t at, uint64_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Feeds the chunks that continue the parse position, in order, until none does.
  void FeedInOrder();
  // Ends the join with `got` (once; later calls do nothing) and tells the waiting members.
  void Decide(absl::StatusOr<ReceivedBundle> got);
  std::optional<absl::Status> OutcomeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StripeJoins* const owner_;
  const StripeJoins::Key key_;
  const uint64_t total_size_;
  const uint32_t stripes_;
  // Owned by the feeding thread (feeding_), which uses them outside the lock.
  PayloadScans scans_;
  BundleAssembler assembler_;

  mutable absl::Mutex mu_;
  int members_ ABSL_GUARDED_BY(mu_) = 0;
  State state_ ABSL_GUARDED_BY(mu_) = State::kOpen;
  absl::Status outcome_ ABSL_GUARDED_BY(mu_);
  bool feeding_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;  // bytes handed to the assembler
  uint64_t wire_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, RawChunk> ahead_ ABSL_GUARDED_BY(mu_);  // by offset, past next_
  std::vector<StripeMember*> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_STRIPE_JOIN_H_
