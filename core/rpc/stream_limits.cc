#include "core/rpc/stream_limits.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tern {

struct StreamLimits::Entry {
  uint64_t id = 0;
  std::string host;
  std::function<void()> cancel;
  absl::Time opened;
  absl::Time last_active;
  uint64_t held = 0;
  bool cancelled = false;   // the sweeper took it (cancel called or about to be)
  bool cancelling = false;  // cancel() is running on `canceller`
  std::thread::id canceller;
};

std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  if (colon == std::string::npos || colon == first) return peer;  // no port part
  return peer.substr(0, colon);
}

StreamLimits::StreamLimits(StreamLimitOptions options)
    : options_(std::move(options)), max_buffered_(options_.max_buffered_bytes) {
  if (options_.sweep_every > absl::ZeroDuration()) sweeper_ = std::thread([this] { SweepLoop(); });
}

StreamLimits::~StreamLimits() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
}

void StreamLimits::SweepLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.sweep_every);
    if (stopping_) break;
    mu_.Unlock();
    Sweep(absl::Now());
    mu_.Lock();
  }
}

absl::StatusOr<std::unique_ptr<StreamLimits::Stream>> StreamLimits::Open(
    const std::string& peer, std::function<void()> cancel) {
  auto e = std::make_shared<Entry>();
  e->host = PeerHost(peer);
  e->cancel = std::move(cancel);
  e->opened = e->last_active = absl::Now();
  absl::MutexLock lock(&mu_);
  if (open_ >= options_.max_streams) {
    return absl::ResourceExhaustedError(
        absl::StrCat(open_, " streams are open, the most this daemon takes (--max_streams=",
                     options_.max_streams, ")"));
  }
  int& from_peer = per_peer_[e->host];
  if (from_peer >= options_.max_streams_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        from_peer, " streams are open from ", e->host,
        ", the most one host may have (--max_streams_per_peer=", options_.max_streams_per_peer,
        ")"));
  }
  ++from_peer;
  ++open_;
  e->id = next_id_++;
  streams_.emplace(e->id, e);
  return std::unique_ptr<Stream>(new Stream(this, std::move(e)));
}

void StreamLimits::SetMaxBufferedBytes(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  max_buffered_ = bytes;
}

int StreamLimits::Sweep(absl::Time now) {
  return CancelWhere([&](const Entry& e) {
    return now - e.last_active > options_.idle_timeout || now - e.opened > options_.max_duration;
  });
}

int StreamLimits::CancelWaiting() {
  return CancelWhere([](const Entry& e) { return e.held == 0; });
}

int StreamLimits::CancelWhere(absl::FunctionRef<bool(const Entry&)> pick) {
  std::vector<std::shared_ptr<Entry>> victims;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : streams_) {
      if (e->cancelled || !pick(*e)) continue;
      e->cancelled = e->cancelling = true;
      e->canceller = std::this_thread::get_id();
      victims.push_back(e);
    }
  }
  for (const auto& e : victims) {
    if (e->cancel) e->cancel();  // outside the lock: it may run the stream's callbacks inline
    absl::MutexLock lock(&mu_);
    e->cancelling = false;
  }
  return static_cast<int>(victims.size());
}

void StreamLimits::Close(Entry* e) {
  absl::MutexLock lock(&mu_);
  buffered_ -= e->held;
  e->held = 0;
  --open_;
  if (--per_peer_[e->host] == 0) per_peer_.erase(e->host);
  streams_.erase(e->id);
  // The sweeper may be cancelling this stream on another thread: what `cancel` refers to must
  // outlive that call. (On the sweeper's own thread, cancel() is what brought us here.)
  if (e->cancelling && e->canceller != std::this_thread::get_id()) {
    mu_.Await(absl::Condition(
        +[](Entry* x) { return !x->cancelling; }, e));
  }
}

int StreamLimits::open_streams() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

uint64_t StreamLimits::buffered_bytes() const {
  absl::MutexLock lock(&mu_);
  return buffered_;
}

StreamLimits::Stream::~Stream() { limits_->Close(entry_.get()); }

absl::Status StreamLimits::Stream::Hold(uint64_t bytes) {
  StreamLimits* l = limits_;
  absl::MutexLock lock(&l->mu_);
  entry_->last_active = absl::Now();
  if (l->buffered_ + bytes > l->max_buffered_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("incoming streams would hold ", l->buffered_ + bytes,
                     " bytes, over this daemon's budget of ", l->max_buffered_,
                     " (--max_buffered_mb=", l->max_buffered_ >> 20, ")"));
  }
  l->buffered_ += bytes;
  entry_->held += bytes;
  return absl::OkStatus();
}

void StreamLimits::Stream::ReleaseAll() {
  StreamLimits* l = limits_;
  absl::MutexLock lock(&l->mu_);
  l->buffered_ -= entry_->held;
  entry_->held = 0;
}

}  // namespace tern
