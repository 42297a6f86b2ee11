#include "worker/stripe_join.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tern {

StripeJoins::~StripeJoins() = default;

absl::StatusOr<std::shared_ptr<StripeJoin>> StripeJoins::Attach(const std::string& caller,
                                                                const ChunkHeader& first) {
  if (first.stripes < 2 || first.stripes > kMaxStripes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a push over ", first.stripes, " stripes (at most ", kMaxStripes, ")"));
  }
  if (first.total_size > max_bundle_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bundle of ", first.total_size, " bytes exceeds the limit of ", max_bundle_bytes_));
  }
  Key key(caller, first.stream_id);
  std::shared_ptr<StripeJoin> join;
  {
    absl::MutexLock lock(&mu_);
    std::weak_ptr<StripeJoin>& slot = joins_[key];
    join = slot.lock();
    if (join == nullptr) {
      join = std::make_shared<StripeJoin>(this, key, first.total_size, first.stripes);
      slot = join;
    }
  }
  if (absl::Status s = join->CheckFields(first); !s.ok()) return s;
  absl::MutexLock lock(&join->mu_);
  if (join->members_ == static_cast<int>(join->stripes_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stream more than the push's ", join->stripes_, " stripes"));
  }
  ++join->members_;
  return join;
}

int StripeJoins::open_joins() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(joins_.size());
}

void StripeJoins::Forget(const Key& key, const StripeJoin* join) {
  absl::MutexLock lock(&mu_);
  auto it = joins_.find(key);
  // A new join under the same key may have taken the slot once this one's last owner let go.
  if (it != joins_.end()) {
    std::shared_ptr<StripeJoin> current = it->second.lock();
    if (current == nullptr || current.get() == join) joins_.erase(it);
  }
}

StripeJoin::StripeJoin(StripeJoins* owner, StripeJoins::Key key, uint64_t total_size,
                       uint32_t stripes)
    : owner_(owner),
      key_(std::move(key)),
      total_size_(total_size),
      stripes_(stripes),
      scans_(owner->codecs_),
      assembler_(owner->max_bundle_bytes_, &scans_) {}

StripeJoin::~StripeJoin() { owner_->Forget(key_, this); }

absl::Status StripeJoin::CheckFields(const ChunkHeader& h) const {
  if (h.total_size == total_size_ && h.stripes == stripes_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "a stripe of stream ", h.stream_id, " says ", h.total_size, " bytes over ", h.stripes,
      " stripes; the push's others said ", total_size_, " over ", stripes_));
}

std::optional<absl::Status> StripeJoin::OutcomeLocked() const {
  if (state_ == State::kDone) return outcome_;
  return std::nullopt;
}

bool StripeJoin::FitsLocked(uint64_t at, uint64_t n) const {
  if (at < next_ || at > total_size_ || n > total_size_ - at) return false;
  auto after = ahead_.lower_bound(at);
  if (after != ahead_.end() && (after->first == at || after->first < at + n)) return false;
  if (after == ahead_.begin()) return true;
  const auto before = std::prev(after);
  return before->first + before->second.data_size <= at;
}

std::optional<absl::Status> StripeJoin::Add(RawChunk chunk) {
  absl::Status bad = CheckFields(chunk.header);
  if (bad.ok()) {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kOpen) return OutcomeLocked();  // deciding: the chunk is not needed
    const uint64_t at = chunk.header.offset;
    if (!FitsLocked(at, chunk.data_size)) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "chunk at offset ", at, " (", chunk.data_size,
          " bytes) overlaps another of the push or runs past its ", total_size_, " bytes"));
    } else {
      wire_bytes_ += chunk.message_size + 5;
      ahead_.emplace(at, std::move(chunk));
      if (feeding_) return std::nullopt;  // the thread feeding takes it in order
      feeding_ = true;
    }
  }
  if (!bad.ok()) {
    Decide(bad);
  } else {
    FeedInOrder();
  }
  absl::MutexLock lock(&mu_);
  return OutcomeLocked();
}

void StripeJoin::FeedInOrder() {
  for (;;) {
    RawChunk c;
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kOpen || ahead_.empty() || ahead_.begin()->first != next_) {
        feeding_ = false;
        return;
      }
      c = std::move(ahead_.begin()->second);
      ahead_.erase(ahead_.begin());
      next_ += c.data_size;
    }
    // The CRC is checked as the chunk is parsed, piece by piece while each is in cache: cheaper
    // than checking it on arrival, on the stream's own thread, and reading it again here.
    absl::Status s = assembler_.Add(c.header, c.data, c.owner);
    if (!s.ok()) {
      Decide(std::move(s));
    } else if (assembler_.complete()) {
      Decide(assembler_.FinishInPlace());
    } else {
      continue;
    }
    absl::MutexLock lock(&mu_);
    feeding_ = false;
    return;
  }
}

void StripeJoin::Decide(absl::StatusOr<ReceivedBundle> got) {
  const bool complete = got.ok();
  uint64_t wire_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kOpen) return;
    state_ = State::kDeciding;
    ahead_.clear();  // nothing waiting is needed any more: its slices go back
    wire_bytes = wire_bytes_;
  }
  // The scans are read only with a complete bundle, which the feeding thread (this one) decides;
  // a failure may be decided while another thread feeds, so it gets none.
  const absl::Status outcome =
      owner_->outcome_(key_.first, std::move(got), wire_bytes, complete ? &scans_ : nullptr);
  std::vector<StripeMember*> waiting;
  {
    absl::MutexLock lock(&mu_);
    state_ = State::kDone;
    outcome_ = outcome;
    waiting.swap(waiting_);
  }
  for (StripeMember* m : waiting) m->JoinDone(outcome);
}

std::optional<absl::Status> StripeJoin::EndOfStream(StripeMember* member) {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kDone) return outcome_;
  waiting_.push_back(member);
  return std::nullopt;
}

bool StripeJoin::Leave(StripeMember* member, const absl::Status& why) {
  bool was_waiting = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find(waiting_.begin(), waiting_.end(), member);
    if (it != waiting_.end()) {
      waiting_.erase(it);
      was_waiting = true;
    }
  }
  Decide(absl::Status(why.code(), absl::StrCat("a stripe of the push ended before the bundle was "
                                               "complete: ",
                                               why.message())));
  return was_waiting;
}

}  // namespace tern
